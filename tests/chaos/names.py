"""The Redis names the chaos suite reads, for the one model its cluster serves.

``shared.keys`` names a model's job stream and job keys per model (hash-tagged); these
helpers bind them to ``MODEL``, the name the workers serve (the model directory's name).
"""

from __future__ import annotations

from shared import keys

MODEL = "tiny-llama"  # tests/chaos/conftest.py builds the model under this directory name
JOBS_GROUP = keys.JOBS_GROUP


_PER_MODEL = hasattr(keys, "jobs_stream")  # else one job stream for every model (older layout)


def jobs_stream() -> str:
    return keys.jobs_stream(MODEL) if _PER_MODEL else str(getattr(keys, "JOBS_STREAM"))  # noqa: B009


def dead_letter_stream() -> str:
    return keys.dead_letter_stream(MODEL) if _PER_MODEL else str(getattr(keys, "DEAD_LETTER_STREAM"))  # noqa: B009


def job_key(job_id: str) -> str:
    return keys.job_key(MODEL, job_id) if _PER_MODEL else keys.job_key(job_id)  # type: ignore[call-arg]


def job_events(job_id: str) -> str:
    return keys.job_events(MODEL, job_id) if _PER_MODEL else keys.job_events(job_id)  # type: ignore[call-arg]
