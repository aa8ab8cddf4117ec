"""The inference engine: scheduler, paged KV cache, model runner, speculation.

The worker service imports only ``worker.engine.api`` (torch-free); ``worker.engine_factory``
builds the engine with ``worker.engine.loader.load_engine``. Module map: docs/architecture.md.
"""
