"""The trainer (an engine): Megatron-core on CPU/gloo or GPUs with tensor, pipeline and data parallelism
(:mod:`.megatron_engine`), Hugging Face <-> Megatron weights (:mod:`.hf_mcore`, :mod:`.hf_weights`), the trainer
group in this process or as torchrun ranks (:mod:`.group`, :mod:`.worker`), the trainer-side steps of a run
(:mod:`.steps`), advantages (:mod:`.advantages`) and the decoupled PPO loss (:mod:`.decoupled_ppo`)."""
