"""OpenAI's Files and Batch API over the job queue (scripted worker)."""

from __future__ import annotations

import json

import httpx
import pytest
import redis.asyncio as aioredis

from shared.schemas import ErrorEvent, JobEvent, JobRequest
from tests.gateway.batch_helpers import _req, _upload
from tests.gateway.conftest import MODEL, gateway, hello, scripted_worker

pytestmark = pytest.mark.anyio


def _lines(*items: dict) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in items).encode()


async def _done(gw: httpx.AsyncClient, batch_id: str, **kw: object) -> dict:
    for _ in range(500):
        got = (await gw.get(f"/v1/batches/{batch_id}", **kw)).json()  # type: ignore[arg-type]
        if got["status"] in ("completed", "cancelled", "failed"):
            return got
    raise AssertionError(f"batch {batch_id} never finished: {got}")


def fail_bad(job: JobRequest) -> list[JobEvent]:
    if job.messages and job.messages[0].content == "bad":
        return [ErrorEvent(job_id=job.job_id, code="bad_request", message="refused")]
    return hello(job)


async def test_a_batch_end_to_end(r: aioredis.Redis) -> None:
    content = _lines(_req("a", "hi"), _req("b", "bad"), _req("c", "x", max_tokens=5), _req("d", "y", n=2))
    async with gateway(r) as gw, scripted_worker(r, fail_bad) as seen:
        up = await _upload(gw, content)
        assert up.status_code == 200, up.text
        file = up.json()
        assert file["object"] == "file" and file["purpose"] == "batch" and file["bytes"] == len(content)
        assert (await gw.get(f"/v1/files/{file['id']}/content")).content == content
        created = await gw.post(
            "/v1/batches",
            json={
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["object"] == "batch" and batch["status"] in ("in_progress", "completed")
        done = await _done(gw, batch["id"])
        out = (await gw.get(f"/v1/files/{done['output_file_id']}/content")).text
        err = (await gw.get(f"/v1/files/{done['error_file_id']}/content")).text
        listed = (await gw.get("/v1/batches")).json()
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    outputs = [json.loads(x) for x in out.splitlines()]
    assert [o["custom_id"] for o in outputs] == ["a", "c"]
    assert outputs[0]["response"]["status_code"] == 200 and outputs[0]["error"] is None
    body = outputs[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "Hello"
    assert body["model"] == MODEL
    errors = {e["custom_id"]: e for e in (json.loads(x) for x in err.splitlines())}
    assert (
        errors["b"]["response"]["status_code"] == 400
        and errors["b"]["response"]["body"]["error"]["message"] == "refused"
    )
    assert errors["d"]["response"]["body"]["error"]["param"] == "n"  # refused before enqueueing
    assert [j.params.max_tokens for j in seen if j.messages and j.messages[0].content == "x"] == [5]
    assert [b["id"] for b in listed["data"]] == [batch["id"]]


async def test_batch_inputs_are_checked_and_owned(r: aioredis.Redis) -> None:
    a, b = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    async with gateway(r, api_keys=("ka", "kb")) as gw:
        wrong_purpose = await _upload(gw, _lines(_req("a", "x")), "fine-tune", headers=a)
        not_form = await gw.post("/v1/files", json={"purpose": "batch"}, headers=a)
        fid = (await _upload(gw, _lines(_req("a", "x"), _req("a", "y")), headers=a)).json()["id"]
        dup = await gw.post(
            "/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions"}, headers=a
        )
        other = await gw.get(f"/v1/files/{fid}", headers=b)
        wrong_url = await gw.post(
            "/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/completions"}, headers=a
        )
        unknown = await gw.get("/v1/batches/batch_nope", headers=a)
    assert wrong_purpose.status_code == 400 and wrong_purpose.json()["error"]["param"] == "purpose"
    assert not_form.status_code == 400
    assert dup.status_code == 400 and "custom_id" in dup.json()["error"]["message"]
    assert other.status_code == 404
    assert wrong_url.status_code == 400
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


async def test_cancelling_a_batch_cancels_its_jobs(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:  # no worker reads: the jobs stay queued
        fid = (await _upload(gw, _lines(_req("a", "x"), _req("b", "y")))).json()["id"]
        batch = (
            await gw.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions"})
        ).json()
        cancelling = (await gw.post(f"/v1/batches/{batch['id']}/cancel")).json()
        assert cancelling["status"] == "cancelling"
        job = (await gw.get(f"/v1/jobs/{batch['id']}-0")).json()
    assert job["status"] == "queued"  # a worker that takes it finds its cancel flag


@pytest.mark.parametrize(
    "content",
    [
        b"[1, 2]\n",
        b"not json\n",
        b'{"custom_id": 5, "url": "/v1/chat/completions", "body": {}}\n',
        b'{"custom_id": "a", "url": "/v1/chat/completions", "body": [1]}\n',
        b'{"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": "x"}}\n',
        b'{"custom_id": "a", "url": "/v1/chat/completions", "method": "GET", "body": {}}\n',
        b"\n\n",
        "\ud800".encode("utf-8", "surrogatepass"),
    ],
)
async def test_hostile_batch_inputs_are_4xx(r: aioredis.Redis, content: bytes) -> None:
    async with gateway(r) as gw:
        up = await _upload(gw, content)
        if up.status_code == 200:
            resp = await gw.post(
                "/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions"}
            )
            assert resp.status_code == 200 or 400 <= resp.status_code < 500, resp.text
            if resp.status_code == 200:  # accepted: each bad line is an error line
                done = await _done(gw, resp.json()["id"])
                assert done["request_counts"]["failed"] == done["request_counts"]["total"]
        else:
            assert 400 <= up.status_code < 500
        junk = await gw.post(
            "/v1/files",
            content=b"--x\r\nnonsense",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        assert junk.status_code == 400
        for path in (
            "/v1/files/..%2F..",
            "/v1/files/a:b/content",
            "/v1/batches/{x}",
            "/v1/batches/a%00b/cancel",
        ):
            got = await (gw.post(path) if path.endswith("cancel") else gw.get(path))
            assert got.status_code == 404, path
