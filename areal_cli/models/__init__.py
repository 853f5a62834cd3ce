"""Models (an engine): the embedded tiny Qwen3 the kit builds itself (:mod:`.tiny`), the model families the
trainer and the embedded engine support (:mod:`.families`: Qwen3, Qwen2, Llama), GGUF files dequantised once into
Hugging Face directories (:mod:`.gguf`) and checkpoints shipped by registry packages (:mod:`.packaged`)."""
