"""Allocation strings as AReaL writes them, parsed and placed on nodes: servers never span a node, trainer
ranks in Megatron order with TP groups inside a node, the controller on node 0; impossible layouts are one
line naming the string; the CPU case places processes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from areal_cli.foundations.errors import UserError
from areal_cli.recipes.placement import MEGATRON_ORDER, Allocation, Parallel, parse_allocation, place, placement_from_dict
from areal_cli.recipes import allocation_gpus, load_recipe, recipe_names
from helpers.one_line import assert_one_line


@pytest.mark.parametrize("text, backend, gen, train", [
    ("sglang.d80m2p1+d4m2p4", "sglang", Parallel(80, 2, 1), Parallel(4, 2, 4)),
    ("sglang.d64p1m1+d32p2m1", "sglang", Parallel(64, 1, 1), Parallel(32, 1, 2)),
    ("sglang.d80m4p1+d4p8m2", "sglang", Parallel(80, 4, 1), Parallel(4, 2, 8)),
    ("d32p1m4", None, None, Parallel(32, 4, 1)),
    ("sglang.d2t2+p2d1t4", "sglang", Parallel(2, 2, 1), Parallel(1, 4, 2)),  # t = m, any order, missing = 1
    ("embedded.d2+d1", "embedded", Parallel(2, 1, 1), Parallel(1, 1, 1)),
])
def test_allocation_strings_parse_into_inference_and_training_degrees(text, backend, gen, train):
    a = parse_allocation(text)
    assert a == Allocation(text, backend, gen, train)
    if backend != "embedded":  # areal_cli.recipes.allocation_gpus knows the sglang./vllm. prefixes
        assert a.total == allocation_gpus(text)
    assert a.n_servers == (gen.dp if gen else 0) and a.server_gpus == (gen.tp * gen.pp if gen else 0)


@pytest.mark.parametrize("text, message", [
    ("sglang.d0m2+d1", "allocation 'sglang.d0m2+d1': part 'd0m2': d must be >= 1"),
    ("sglang.d2m2", "allocation 'sglang.d2m2': a 'sglang.' backend needs an inference part and a training part"),
    ("sglang.d2m2t2+d1", "allocation 'sglang.d2m2t2+d1': part 'd2m2t2': tp given twice (m and t)"),
    ("sglang.d2d2+d1", "part 'd2d2': dp given twice (d and d)"),
    ("d4q2", "allocation 'd4q2': part 'd4q2': unknown degree 'q'"),
    ("ray.d2+d2", "unknown backend 'ray'"),
    ("d4+d4", "2 parts need a backend prefix"),
    ("sglang.d2m+d1", "part 'd2m': expected letters d, m (or t), p each followed by a number"),
    ("sglang.+d1", "empty part"),
    ("", "empty"),
])
def test_malformed_allocations_are_one_line_naming_the_string_and_part(text, message):
    with pytest.raises(UserError) as e:
        parse_allocation(text)
    assert_one_line(str(e.value), message)


def test_servers_fill_nodes_first_then_trainer_ranks_in_megatron_order():
    p = place(parse_allocation("sglang.d80m2p1+d4m2p4"), nodes=24, gpus_per_node=8)  # boba2-8b-code
    assert p.servers[:5] == [(0, (0, 1)), (0, (2, 3)), (0, (4, 5)), (0, (6, 7)), (1, (0, 1))]
    assert {n for n, _ in p.servers} == set(range(20))
    assert p.trainer_ranks[:9] == [(20, g) for g in range(8)] + [(21, 0)]
    assert p.training_nodes == [20, 21, 22, 23] and p.controller_node == 0
    # tp fastest, then dp, then pp (order tp-cp-ep-dp-pp): one pipeline stage per training node here
    assert MEGATRON_ORDER == "tp-cp-ep-dp-pp"
    t = p.allocation.train
    assert [t.coords(r) for r in (0, 1, 2, 7, 8, 31)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 3, 0), (0, 0, 1), (1, 3, 3)]
    assert all({t.coords(r)[2] for r in p.ranks_on(n)} == {i} for i, n in enumerate(p.training_nodes))
    assert [s.gpus_free for s in p.summary()] == [0] * 24


def test_megatron_order_matches_megatron_core_default():
    import inspect

    ps = pytest.importorskip("megatron.core.parallel_state")
    assert inspect.signature(ps.initialize_model_parallel).parameters["order"].default == MEGATRON_ORDER


def test_no_server_and_no_tensor_parallel_group_crosses_a_node():
    # 3-GPU servers leave 2 GPUs of node 0 idle; TP2 groups fill what is left on node 1
    p = place(parse_allocation("sglang.d3m3p1+d2m2"), nodes=2, gpus_per_node=8)
    assert p.servers == [(0, (0, 1, 2)), (0, (3, 4, 5)), (1, (0, 1, 2))]
    assert p.trainer_ranks == [(1, 3), (1, 4), (1, 5), (1, 6)]
    assert [(s.gpus_used, s.gpus_free) for s in p.summary()] == [(6, 2), (7, 1)]
    for r in range(0, 4, 2):  # each TP group on one node
        assert p.trainer_ranks[r][0] == p.trainer_ranks[r + 1][0]


def test_every_shipped_allocation_fits_its_published_nodes_exactly():
    for name in recipe_names():
        r = load_recipe(name).file.resources
        if r.allocation:
            p = place(parse_allocation(r.allocation), nodes=r.nodes, gpus_per_node=r.gpus_per_node)
            assert sum(s.gpus_used for s in p.summary()) == r.gpus, name
            assert placement_from_dict(p.to_dict()).to_dict() == p.to_dict()


@pytest.mark.parametrize("text, nodes, gpn, message", [
    ("sglang.d80m4p1+d4p8m2", 2, 8, "allocation 'sglang.d80m4p1+d4p8m2' needs 384 GPUs"),
    ("sglang.d1m16+d1", 4, 8, "one sglang server uses tp*pp = 16 GPUs, more than a node's 8"),
    ("d3m3", 2, 8, "training tensor parallel 3 must divide the 8 GPUs per node"),
    ("sglang.d3m3+d3m2", 2, 8, "does not fit on 2 x 8 GPUs"),  # 15 of 16 GPUs, but 3 nodes
    ("d2", 0, 8, "nodes must be >= 1"),
    ("d2", 1, -1, "gpus per node must be >= 0"),
])
def test_impossible_layouts_are_one_line(text, nodes, gpn, message):
    with pytest.raises(UserError) as e:
        place(parse_allocation(text), nodes=nodes, gpus_per_node=gpn)
    assert_one_line(str(e.value), message, f"'{text}'")


def test_cpu_placement_puts_processes_on_one_host_or_spreads_them_evenly():
    one = place(parse_allocation("embedded.d2+d1"), nodes=1, gpus_per_node=0)
    assert one.servers == [(0, ()), (0, ())] and one.trainer_ranks == [(0, None)] and one.cpu
    assert one.describe()[0] == "allocation embedded.d2+d1 on 1 node x 0 GPUs: 3 processes placed (CPU: no GPUs)"
    two = place(parse_allocation("embedded.d2+d2m2"), nodes=2, gpus_per_node=0)
    assert [n for n, _ in two.servers] == [0, 1]
    assert [n for n, _ in two.trainer_ranks] == [0, 0, 1, 1]  # TP pairs kept together
    assert two.training_nodes == [0, 1]


def test_describe_and_table_summarise_identical_nodes():
    p = place(parse_allocation("sglang.d80m4p1+d4p8m2"), nodes=48, gpus_per_node=8)  # boba2-14b-code
    assert p.describe() == [
        "allocation sglang.d80m4p1+d4p8m2 on 48 nodes x 8 GPUs: 384 of 384 GPUs placed",
        "inference: 80 sglang servers (tp 4, pp 1; 4 GPUs each) on nodes 0-39",
        "training: 64 Megatron ranks (dp 4 x tp 2 x pp 8; order tp-cp-ep-dp-pp: rank = tp + 2*(dp + 4*pp)) "
        "on nodes 40-47; torchrun --nnodes 8",
        "controller: node 0",
        "node 0: controller; servers 0-1 (GPUs 0-3 | 4-7)",
        "nodes 1-39: servers 2-79 (2 per node, GPUs 0-3 | 4-7)",
        "nodes 40-47: trainer ranks 0-63 (8 per node, GPUs 0-7, pp stages 0-7)",
    ]
    console = Console(file=io.StringIO(), width=200)
    console.print(p.table())
    rows = [line for line in console.file.getvalue().splitlines() if line.startswith("│")]
    assert len(rows) == 3 and "40-47" in rows[2] and "0-63" in rows[2]
