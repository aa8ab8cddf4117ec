"""One worker per accelerator: pulls jobs, runs the engine, streams tokens back."""
