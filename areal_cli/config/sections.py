"""The sections of :class:`TrainConfig`: every setting of an ``areal train`` run, with its type and meaning.

Megatron-core's ``TransformerConfig`` is the model: one dataclass per concern, one docstring per field (the
string after it, which :func:`areal_cli.config.keys.field_docs` reads), enumerations as ``Literal`` types
(checked when a value is read and again by :meth:`TrainConfig.validate`). Names follow AReaL where one exists
(``max_head_offpolicyness``, ``behav_imp_weight_cap``, ``prox_logp_method``, ...).

A key is written ``section.field`` in recipes and ``-o`` overrides (``rollout.group_size: 8``,
``-o ppo.lr=1e-5``); the flat names of earlier releases (``group_size``, ``sft_lr``, ``trainer_data_parallel``)
are still read, with a one-line note (:data:`areal_cli.config.keys.FLAT_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: Off-policy corrections of the behaviour weight (the loss's own list: areal_cli.trainer.decoupled_ppo; a test
#: keeps the two equal without importing torch here).
BEHAV_IMP_WEIGHT_MODES = ("token_mask", "token_truncate", "sequence_mask", "sequence_truncate", "disabled")

BehavImpWeightMode = Literal["token_mask", "token_truncate", "sequence_mask", "sequence_truncate", "disabled"]


@dataclass
class ModelSection:
    """The policy: a Hugging Face checkpoint folder, or the embedded tiny Qwen3 the kit builds itself."""

    path: str | None = None
    """Checkpoint folder (config.json, weights, tokenizer); None: build the embedded tiny Qwen3 (no download)."""
    hidden_size: int = 128
    """Embedded tiny model only: hidden size."""
    num_layers: int = 2
    """Embedded tiny model only: decoder layers."""
    vocab_size: int = 512
    """Embedded tiny model only: tokenizer vocabulary (trained on the task's corpus)."""
    chat_template: Literal["chatml", "qwen3", "r1"] = "chatml"
    """Embedded tiny model only: chat template. ``chatml`` (<|im_start|>...), ``qwen3`` (chatml + <think>
    tokens) or ``r1`` (DeepSeek-R1's <｜User｜>/<｜Assistant｜>, BOS, <think>), so miniatures read the upstream
    record formats."""


@dataclass
class TaskSection:
    """What is trained on and how it is scored: dataset, prompt, reward and rollout workflow
    (:mod:`areal_cli.api`; presets in :mod:`areal_cli.tasks.registry`). ``""`` means the preset's value. User
    code is named ``package.module:attr`` or ``path/file.py:attr`` (relative paths: to the recipe's folder;
    ``-o`` overrides: to the current directory)."""

    preset: str = "tiny-arith"
    """Task preset: tiny-arith | tiny-longtail | math-rl | code-rl | math-multi-turn | custom | ..."""
    dataset: str = ""
    """Training records: a .jsonl/.parquet file or folder, ``hf:OWNER/NAME[/file]`` (at dataset_revision), or
    ``module:function(split, seed) -> Iterable[dict]``."""
    dataset_revision: str = ""
    """``hf:`` datasets: a 40-hex commit of the dataset repository."""
    dataset_split: str = "train"
    """``hf:`` datasets: the split."""
    eval_dataset: str = ""
    """Held-out records (same forms); "": heldout_fraction of the dataset, chosen by a hash of the id."""
    heldout_fraction: float = 0.1
    """Share of the dataset held out for evaluation when eval_dataset is "" (in [0, 1))."""
    shuffle_dataset: bool = True
    """A new seeded order every epoch."""
    prompt_field: str = ""
    """The record field with the prompt (a string, or a messages list)."""
    prompt_template: str = ""
    """``chat`` | ``none`` | an ``areal eval`` protocol (r1-distill, qwen3-think, ...)."""
    id_field: str = ""
    """The record field that identifies it ("": ``id`` if present, else file:line)."""
    required_fields: list[str] = field(default_factory=list)
    """Record fields that must be present; a record without one is a file:line error."""
    reward: str = ""
    """``reward(prompt, completion, prompt_ids, completion_ids, **fields) -> float``."""
    workflow: str = ""
    """``async arun_episode(client, item) -> Group | None``; "": areal_cli.workflows.rlvr:RLVRWorkflow."""
    workflow_args: dict = field(default_factory=dict)
    """Keyword arguments of the workflow class; ``-o`` merges into them (``-o task.workflow_args.NAME=V``, or
    ``-o task.workflow_args={NAME: V}``; ``null`` removes one)."""
    max_prompt_len: int = 0
    """Tokens; longer prompts are dropped and counted (0: no limit)."""
    code_dir: str = ""
    """Put first on sys.path for ``module:attr`` names ("": the recipe's folder)."""
    reward_timeout_s: float = 5.0
    """Seconds one reward call may take; a call past it is killed and counted as a reward failure, and its episode
    (its whole group) is dropped, as a failing reward is: never a silent 0."""
    reward_workers: int = 1
    """Processes that compute rewards."""
    sandbox_isolation: Literal["auto", "strict"] = "auto"
    """Code tasks: ``strict`` refuses to grade without every sandbox layer; ``auto`` uses what the host has."""


@dataclass
class SftSection:
    """The supervised warm start (:mod:`areal_cli.sft.stage`) that runs before RL; part of the recipe."""

    n_examples: int = 4000
    """Training examples generated or read for the warm start."""
    batch_size: int = 64
    """Sequences per optimiser step."""
    lr: float = 1e-3
    """Learning rate (AdamW; betas, eps, weight decay and grad clip from the ppo section)."""
    max_steps: int = 400
    """Optimiser steps at most (0: no warm start)."""
    eval_every: int = 10
    """Steps between held-out greedy evaluations."""
    stop_accuracy: float = 0.4
    """Stop as soon as held-out greedy accuracy reaches this (<= 0.5, so RL has something to learn)."""
    max_tokens_per_mb: int = 16384
    """Micro-batches of at most this many tokens (first-fit decreasing)."""
    pack_row_tokens: int = 0
    """Sequences are packed end to end into rows of this many tokens (0: as wide as the micro-batch's longest
    sequence)."""
    target_field: str = ""
    """The record field whose text is the warm start's target completion."""


@dataclass
class RolloutSection:
    """Generation: batch shape, sampling, the staleness bound and the rollout servers."""

    n_servers: int = 1
    """Rollout servers."""
    batch_size: int = 16
    """Prompt groups consumed per training step."""
    group_size: int = 8
    """Samples per prompt (n)."""
    max_head_offpolicyness: int = 4
    """Staleness bound eta (AReaL, boba² §4): a sample may be generated by a policy at most eta versions older
    than the one it trains; 0 = synchronous PPO."""
    max_concurrent_rollouts: int = 0
    """Cap on groups in flight; 0: batch_size * (eta + 1)."""
    stale_groups: Literal["drop", "train"] = "drop"
    """A group finished after later ones (a long answer, a re-issued straggler) may be older than eta when the
    trainer takes it: ``drop`` it (staleness_max <= eta for every trained batch; counted, its slot goes back to
    admission) or ``train`` on it (AReaL's rule: staleness bounded at admission only; no selection against long
    answers, realised staleness in staleness_hist)."""
    temperature: float = 1.0
    """Sampling temperature (>= 0)."""
    top_p: float = 1.0
    """Nucleus sampling; training needs 1.0 (the servers report logprobs of the untruncated distribution)."""
    top_k: int = -1
    """Top-k sampling; -1: off."""
    max_new_tokens: int = 8
    """Tokens generated per sample at most."""
    min_new_tokens: int = 0
    """End tokens are masked until this many tokens were generated."""
    success_rate_lb: float = 0.0
    """Groups whose success rate is below this are dropped (counted)."""
    success_rate_ub: float = 1.0
    """Groups whose success rate is above this are dropped (counted)."""
    filter_patience_batches: int = 10
    """The run stops (exit 2, one line naming the filter's settings and its counts; metrics and summary.json
    written up to then) once the success-rate filter has dropped this many batches' worth of groups (x batch_size)
    in a row with none accepted: the policy's samples all agree (all right or all wrong, e.g. after a warm start
    too short to learn the task), and with 0 of N groups passing the pass rate is below 3/N (95% confidence), so
    one batch would need more than N * batch_size / 3 further groups. 0: wait forever."""
    interruptible: bool = True
    """Weight updates interrupt in-flight samples (how: ``pause_mode``) and they go on with the new weights;
    False: the update waits for them to finish on the old weights."""
    pause_mode: Literal["abort", "in_place"] = "abort"
    """How an interruptible weight update treats in-flight samples (SGLang's ``/pause_generation`` mode):
    ``abort`` (AReaL, boba² §4.1: they return partial and are resubmitted as prompt + tokens so far, so their
    KV cache is recomputed with the new weights) or ``in_place`` (PipelineRL's in-flight weight update, Piché et
    al. 2025: they keep their KV cache, computed with the old weights, and decode on with the new ones; no
    re-prefill). Either way every token's behaviour logprob is that of the distribution it was sampled from,
    which is what the decoupled loss needs; in_place only changes what that distribution conditions on. With
    in_place the engine-vs-trainer logprob mismatch (``logprob_mismatch_*``) can only be measured on samples
    generated entirely by the trainer's version, which a full pipeline rarely trains (its token count falls to 0
    after the first steps): check the numerics with a short run in abort mode. With SGLang, in_place loads ask
    for no prefix-cache flush (SGLang asserts the flush succeeds, and it fails while requests run)."""
    engine: Literal["embedded", "sglang", "external"] = "embedded"
    """``embedded`` (the kit's CPU server, n_servers of them), ``sglang`` (n_servers real SGLang servers launched as
    children from ``sglang_python``: on GPUs, or in SGLang's CPU mode on a machine without CUDA) or ``external``
    (servers already running: server_urls or $AREAL_LLM_SERVER_ADDRS)."""
    server_urls: str = ""
    """External engine: comma-separated host:port."""
    server_max_running_requests: int = 256
    """Requests a server decodes at once; 0: SGLang decides (engine sglang only)."""
    server_max_total_tokens: int = 65536
    """KV-cache cap per server, tokens; 0: SGLang decides (engine sglang only)."""
    server_max_restarts: int = 3
    """Servers that die or stop answering are restarted with the current weights
    (:mod:`areal_cli.rollout.supervisor`), at most this many times each."""
    server_stall_timeout_s: float = 60.0
    """A server with requests in flight and no answer for this long is probed with /model_info and restarted
    when that fails too."""
    sglang_tp_size: int = 1
    """GPUs per SGLang server (tensor parallel)."""
    sglang_mem_fraction_static: float = 0.8
    """Share of GPU memory SGLang reserves for weights and KV cache, in (0, 1)."""
    sglang_dtype: Literal["", "auto", "bfloat16", "float16", "float32"] = ""
    """SGLang's --dtype; "": bfloat16 on GPUs, float32 on a machine without CUDA (SGLang's CPU mode, the trainer's
    precision there)."""
    sglang_extra_args: str = ""
    """Appended verbatim (shell-split) to ``python -m sglang.launch_server``."""
    sglang_python: str = ""
    """The Python that runs SGLang servers (SGLang pins its own torch, so it usually has an environment of its own):
    a path to an interpreter or a virtual environment; "": $AREAL_SGLANG_PYTHON, else this Python if it imports
    sglang, else the environment ``areal engine setup sglang`` built. On a machine without CUDA the servers run
    in SGLang's CPU mode (``--device cpu --attention-backend torch_native --sleep-on-idle``,
    ``SGLANG_USE_CPU_ENGINE=1``)."""
    sglang_context_length: int = 0
    """SGLang's --context-length; 0: max_prompt_len (or 1024) + max_new_tokens."""
    weight_update_mode: Literal["disk", "xccl"] = "disk"
    """Weight sync after each step: ``disk`` (save HF weights, /update_weights_from_disk) or ``xccl`` (AReaL's
    name: /update_weights_from_distributed, a bucketed broadcast from the trainer's head rank; nccl on GPUs,
    gloo on CPU)."""
    weight_update_chunk_mb: float = 1024.0
    """Bucket size of the distributed weight sync, MB."""

    @property
    def effective_max_concurrent(self) -> int:
        """Concurrency cap on running groups: max_concurrent_rollouts, or batch_size * (eta + 1)."""
        return self.max_concurrent_rollouts or self.batch_size * (self.max_head_offpolicyness + 1)


@dataclass
class PPOSection:
    """The policy update: optimiser, decoupled PPO loss (boba² §5, Eq. 5), off-policy corrections, advantages."""

    lr: float = 3e-4
    """Learning rate of the RL steps (AdamW)."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over max_steps (:func:`areal_cli.sft.stage.lr_at`)."""
    warmup_proportion: float = 0.0
    """Linear warmup over this fraction of max_steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW eps (> 0)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    eps_clip: float = 0.2
    """PPO clip range of pi_theta / pi_prox."""
    behav_imp_weight_cap: float = 5.0
    """Cap on the behaviour weight w = pi_prox / pi_behav (> 1; tokens above it are masked or truncated)."""
    behav_imp_weight_mode: BehavImpWeightMode = "token_mask"
    """Off-policy correction of w (:mod:`areal_cli.trainer.decoupled_ppo`): token_mask (AReaL), token_truncate
    (TIS), sequence_mask (MIS), sequence_truncate, disabled."""
    behav_imp_weight_lower: float = 0.0
    """Mask modes: also mask w below this (IcePop's alpha, e.g. 0.5); 0: off."""
    adv_norm: Literal["group", "global"] = "group"
    """Advantage normalisation: per prompt group (GRPO) or over all valid tokens of the batch (``global``: the
    REINFORCE++ style global normalisation, Hu 2025; AReaL ``adv_norm: {mean_level: batch, std_level: batch}``)."""
    algorithm: Literal["grpo", "ppo", "dr_grpo", "dapo", "gspo", "rloo", "cispo"] = "grpo"
    """Algorithm preset (:mod:`areal_cli.config.algorithms`): fills the keys of its recipe that the recipe and -o
    leave unset; ``grpo`` is today's loss and advantages (sets nothing); ``ppo`` turns the critic on."""
    discount: float = 1.0
    """GAE discount gamma (AReaL ``discount``; :func:`areal_cli.trainer.advantages.gae_advantages`): per token of a
    response; without a critic GAE runs with values 0 (AReaL's), so the reward is discounted back from the last
    token by (discount * gae_lambda)^k."""
    gae_lambda: float = 1.0
    """GAE lambda (AReaL ``gae_lambda``): 1 = Monte-Carlo return minus the value, 0 = one-step TD."""
    entropy_coeff: float = 0.0
    """Entropy bonus (verl ``entropy_coeff``): the loss minus entropy_coeff times the policy's entropy over the
    whole vocabulary at each loss token (at rollout.temperature), aggregated as the loss; 0: not computed."""
    eps_clip_higher: float | None = None
    """Upper clip range (DAPO clip-higher, AReaL ``eps_clip_higher``): u is clipped to [1 - eps_clip,
    1 + eps_clip_higher]; None: symmetric."""
    c_clip: float | None = None
    """Dual clip (Ye et al. 2020; AReaL ``c_clip``, > 1): for A < 0 the token's loss is at most c_clip * |A|; None: off."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation (verl's names; :mod:`areal_cli.trainer.loss_terms`): token-mean (AReaL, DAPO), mean over
    sequences of each sequence's token mean (GRPO paper, GSPO), or token sums over sequences x max_new_tokens
    (Dr.GRPO's constant normaliser). Zero-variance groups count in every denominator (their tokens / sequences)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Ratio u = pi_theta / pi_prox per token, or per sequence s = exp(mean_t log u_t) (GSPO, AReaL's key; needs a
    sequence-level behaviour correction: sequence_mask, sequence_truncate or disabled)."""
    loss_fn: Literal["ppo", "cispo"] = "ppo"
    """Policy loss: ``ppo`` (clipped, decoupled) or ``cispo`` (MiniMax-M1 2025: -sg(clip(u, 1 - eps_clip,
    1 + eps_clip_higher)) * A * log pi_theta, times the behaviour weight)."""
    reward_norm_mean_level: Literal["", "group", "batch", "none"] = ""
    """Advantage baseline over samples (AReaL ``reward_norm.mean_level``); "": from adv_norm (group: group)."""
    reward_norm_std_level: Literal["", "group", "batch", "none"] = ""
    """Advantage scale over samples (AReaL ``reward_norm.std_level``; none: Dr.GRPO, batch: LitePPO); "": from
    adv_norm (group: group)."""
    reward_norm_mean_leave1out: bool = False
    """Leave-one-out group mean (RLOO, Ahmadian et al. 2024; AReaL ``reward_norm.mean_leave1out``)."""
    kl_ctl: float = 0.0
    """KL to the frozen initial policy (the weights after the warm start; AReaL ``kl_ctl``, verl ``kl_coef`` /
    ``kl_loss_coef``; :mod:`areal_cli.trainer.kl`); 0: off, no reference is kept."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """KL estimator (AReaL ``kl_estimator``; Schulman 2020): k1 = log pi/pi_ref, k2 = (log pi/pi_ref)^2 / 2, k3 =
    pi_ref/pi - 1 - log(pi_ref/pi) (verl's low_var_kl)."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the KL goes: ``reward`` (AReaL, verl ``use_kl_in_reward``: per-token reward -kl_ctl * k summed into
    each token's advantage) or ``loss`` (verl ``use_kl_loss``: + kl_ctl * k aggregated as the policy loss)."""
    overlong_reward_penalty: bool = False
    """DAPO overlong reward shaping (AReaL's key): reward -= factor * (len - (max_new_tokens - overlong_tokens)) /
    overlong_tokens for responses longer than max_new_tokens - overlong_tokens."""
    overlong_tokens: int = 0
    """The penalised tail, tokens (AReaL ``overlong_tokens``); 0: a fifth of rollout.max_new_tokens (DAPO's 4096 of
    20480)."""
    overlong_penalty_factor: float = 1.0
    """The penalty at max_new_tokens (AReaL ``overlong_penalty_factor``)."""
    reward_bias: float = 0.0
    """Reward shaping before advantages (AReaL actor): clip((r + reward_bias) * reward_scaling, +-max_reward_clip)."""
    reward_scaling: float = 1.0
    """See reward_bias (> 0)."""
    max_reward_clip: float = 20.0
    """See reward_bias; 0: no clip."""
    n_minibatches: int = 1
    """Optimiser steps per training step (AReaL ppo_n_minibatches); must divide rollout.batch_size."""
    max_tokens_per_mb: int = 0
    """Micro-batches of at most this many tokens per forward/backward (first fit decreasing, sequences packed;
    :mod:`areal_cli.trainer.micro_batches`); 0: one micro-batch per minibatch, right-padded."""
    pack_width_classes: bool = True
    """With max_tokens_per_mb: split each packed micro-batch into classes of similar length, each packed at its own
    width, when the estimated attention saved pays for the extra passes (``micro_batches.width_classes``)."""
    recompute_proximal: bool = True
    """Decoupled PPO (boba² Eq. 5); False: proximal := behaviour (standard PPO)."""
    prox_logp_method: Literal["auto", "recompute", "reuse"] = "auto"
    """Where the proximal logprobs come from (AReaL actor.prox_logp_method): ``recompute`` = a forward pass with
    the weights before the step; ``reuse`` = the training forward's own logprobs, detached (exact when the step
    is one optimiser step, n_minibatches = 1; one forward pass fewer per step); ``auto`` = reuse when
    n_minibatches = 1, else recompute."""


@dataclass
class CriticSection:
    """PPO with a critic (AReaL's ``critic`` block; :mod:`areal_cli.trainer.critic`): a value model with the policy's
    architecture and initial weights, its LM head replaced by a zero-initialised linear value head, trained beside
    the policy on the same ranks with its own AdamW; advantages by GAE (ppo.discount, ppo.gae_lambda)."""

    enabled: bool = False
    """Train a critic and take advantages from GAE over its values (the ``ppo`` algorithm preset sets it)."""
    lr: float = 0.0
    """Critic learning rate (AdamW); 0: ppo.lr."""
    weight_decay: float = 0.0
    """Critic AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Critic global gradient-norm clip."""
    eps_clip: float = 0.5
    """Value clipping (AReaL critic ``eps_clip``, verl ``cliprange_value``): the clipped value is
    old + clip(V - old, -eps_clip, eps_clip) and the loss the larger of the two squared errors; 0: no clipping."""
    n_minibatches: int = 1
    """Critic optimiser steps per training step (AReaL critic ``ppo_n_minibatches``); divides rollout.batch_size."""


@dataclass
class ParallelSection:
    """Where the work runs: trainer parallelism (world = data x tensor x pipeline ranks), processes, CPU pinning."""

    data: int = 1
    """Trainer data-parallel ranks. World 1 = the trainer thread in this process (default), else torchrun ranks
    on this machine (logs/trainer-rank*.log)."""
    tensor: int = 1
    """Trainer tensor-parallel ranks (Megatron-core)."""
    pipeline: int = 1
    """Trainer pipeline-parallel stages (Megatron-core)."""
    rollout_process: bool = False
    """Run the rollout controller in its own process (no GIL shared with the trainer)."""
    torch_threads: int = 1
    """torch intra-op threads of the trainer."""
    trainer_cpus: str = ""
    """CPU pinning of the trainer thread (forward/backward, optimiser, weight saving): a Linux cpu list such as
    ``0`` or ``0-3,6``; "": none."""
    server_cpus: str = ""
    """CPU pinning of every embedded server process ("": none)."""
    controller_cpus: str = ""
    """CPU pinning of the rollout controller (HTTP client, reward dispatch) and its reward workers: the rest of
    this process, or with rollout_process the rollout process (this process's other threads then go with
    trainer_cpus). "": none."""

    @property
    def world_size(self) -> int:
        """Trainer ranks: data x tensor x pipeline."""
        return self.data * self.tensor * self.pipeline


@dataclass
class LoopSection:
    """The training loop: length, held-out evaluation, tracking and checkpoints."""

    max_steps: int = 200
    """RL steps at most."""
    epochs: int = 0
    """> 0: max_steps = epochs * (training records // batch_size), as AReaL counts (file datasets)."""
    target_accuracy: float = 0.9
    """Stop early once held-out accuracy reaches it (0 disables)."""
    eval_every: int = 1
    """Steps between held-out evaluations."""
    eval_n_prompts: int = 128
    """Held-out prompts of the task evaluated every eval_every steps (0: none)."""
    eval_n_samples: int = 1
    """Samples per held-out prompt."""
    eval_temperature: float = 0.0
    """Sampling temperature of the evaluations; 0: greedy."""
    eval_deferred: bool = False
    """Run the held-out evaluations after the RL loop, from the weights kept at each evaluation step
    (:mod:`areal_cli.train_loop.deferred_eval`): the RL clock then has no evaluation in it, which an in-loop
    evaluation would hand to the rollout side as free generation time (``areal bench throughput`` sets it)."""
    eval_benchmarks: list[str] = field(default_factory=list)
    """``areal eval`` benchmarks evaluated in the loop (:mod:`areal_cli.eval.in_loop`), every
    eval_benchmark_every steps and after the warm start, with the held-out evaluation's sampling. An entry may be
    a custom task (:mod:`areal_cli.eval.custom_task`): a task YAML or records file (relative to the recipe), or
    NAME with eval_data_dir/NAME.yaml."""
    eval_data_dir: str = ""
    """Benchmark files (like ``areal eval --data-dir``; relative to the recipe)."""
    eval_protocol: str = ""
    """"": chat-template for the embedded tiny model, else the benchmarks' default."""
    eval_benchmark_every: int = 0
    """Steps between benchmark evaluations (0: every eval_every)."""
    eval_max_problems: int = 0
    """The first N problems of each benchmark (0: all)."""
    time_limit_s: float = 0.0
    """Wall-clock limit of the RL loop, seconds (0: none)."""
    loggers: str = ""
    """Experiment tracking (:mod:`areal_cli.train_loop.tracking`): ``tensorboard``, ``wandb`` or both, comma-separated."""
    wandb_project: str = "areal"
    """W&B project."""
    log_samples_every: int = 1
    """Steps between logged samples (0: none): ``loop.log_samples_n`` of the trajectories a step trains on --
    prompt and completion text, reward, the policy versions of the first and last generated token, finish reason,
    group and step; a multi-turn conversation as a whole, with its number of turns -- appended to
    ``samples.jsonl`` in the run folder and shown as a table in TensorBoard / W&B (``loop.loggers``;
    :mod:`areal_cli.train_loop.samples`)."""
    log_samples_n: int = 4
    """Samples (conversations, for a multi-turn workflow) logged per logged step, taken from as many groups as
    possible (0: none)."""
    checkpoint_every: int = 0
    """Checkpoint every N RL steps into DIR/checkpoints/step-NNNNNN (0: off); ``areal train --resume DIR``
    continues from the newest."""
    keep_checkpoints: int = 2
    """The newest N checkpoints are kept."""


#: Section name -> its dataclass, in the order a config is written.
SECTIONS: dict[str, type] = {"model": ModelSection, "task": TaskSection, "sft": SftSection, "rollout": RolloutSection,
                             "ppo": PPOSection, "critic": CriticSection, "parallel": ParallelSection,
                             "loop": LoopSection}
