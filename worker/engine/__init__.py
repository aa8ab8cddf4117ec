"""The inference engine: scheduler, paged KV cache, model runner, speculation."""
