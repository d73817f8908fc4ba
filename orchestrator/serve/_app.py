"""Any lanefold Backend served over HTTP as an OpenAI-compatible API.

`/v1/models`, `/v1/completions` and `/v1/chat/completions`. A request's `n` becomes ONE
SampleRequest of `n` lanes with `share_prefix=True`, so a prefix-sharing backend (the bundled
engine) prefills the prompt once and forks it; lane i samples with `seed + i`. A chat request
carries its messages to the backend (the engine applies the model's chat template); a completion
sends its prompt as it is. What guards the port (key, body cap, admission, hang-ups) lives in
`_guard`; how a failure is told to the client, in `_outcomes`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanefold.primitives import (
    Backend,
    ChatMessage,
    ContextWindow,
    LanefoldError,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    TextDelta,
    Usage,
    sample_all,
)
from lanefold.serve._guard import (
    Admission,
    HTTPError,
    KeyCheck,
    ListeningStream,
    Stopping,
    read_json,
    unless_disconnected,
)
from lanefold.serve._outcomes import bill, closing, on_error, stream_of, told, usage_body, whole
from lanefold.serve._wire import (
    ChatBody,
    CompletionBody,
    chat_logprobs,
    completion_logprobs,
    flatten_messages,
    refusal,
)

__all__ = ("create_app", "served_names")

_Body = TypeVar("_Body", bound=BaseModel)
_Shape = Callable[[int, str, Sample | None], dict[str, Any]]  # (lane, text, final) -> choice


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPError)
    return exc.response()


def _validated(data: Any, model: type[_Body]) -> _Body:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = refusal(exc.errors())
        raise HTTPError(400, message, param=param) from None
    except RecursionError:
        raise HTTPError(400, "the request body's JSON is nested too deeply") from None


def served_names(backend: Backend, model_name: str) -> frozenset[str]:
    """The model ids a request may name: `model_name`, and where that is the backend's own
    `kind:model` name (the default), the bare model too, the name configs and clients use
    (`engine:smollm2-135m` answers to `smollm2-135m`; `openai:gpt-4o-mini` to `gpt-4o-mini`)."""
    kind, colon, model = model_name.partition(":")
    if model_name == backend.name and colon and kind and model:
        return frozenset({model_name, model})
    return frozenset({model_name})


def create_app(
    backend: Backend,
    *,
    model_name: str,
    default_max_tokens: int = 256,
    max_n: int = 128,
    clock: Callable[[], float] = time.time,
    seed_source: Callable[[], int] | None = None,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    max_waiting: int | None = None,
    running_lanes: int | None = None,
) -> Starlette:
    """An ASGI app serving `backend` as the model `model_name` (also answering to the bare
    model name where `model_name` is the backend's `kind:model`: `served_names`).

    The caller owns `backend` (the app never closes it). `seed_source` draws the seed of a
    request that sends none. `api_key`: every request must carry it as a Bearer token.
    `running_lanes` (default: the backend's `max_lanes_per_request`, its batch) bounds the lanes
    on the backend at once; up to `max_waiting` requests (None: any number) wait beyond it, and
    the rest get 429 with Retry-After.
    """
    draw_seed = seed_source or (lambda: secrets.randbelow(2**31))
    admission = Admission(running_lanes or backend.max_lanes_per_request, max_waiting)
    stopping = Stopping()  # `app.state.stopping.stop()` ends every request in flight
    names = served_names(backend, model_name)

    def plan(
        body: ChatBody | CompletionBody,
        prompt: str,
        messages: tuple[ChatMessage, ...] | None,
        max_tokens: int | None,
        logprobs: bool,
        ceiling_param: str = "max_tokens",
        top_logprobs: int = 0,
    ) -> list[SampleRequest]:
        """The backend requests answering `body`: its `n` lanes, at most a backend's worth each."""
        if body.model is not None and body.model not in names:
            raise HTTPError(404, f"model {body.model!r} not found", param="model", code="model_not_found")
        if body.stream_options is not None and not body.stream:
            raise HTTPError(400, "stream_options is only allowed with stream", param="stream_options")
        if body.n > max_n:
            raise HTTPError(400, f"n may be at most {max_n}", param="n")
        ceiling = max_tokens or default_max_tokens
        seed = draw_seed() if body.seed is None else body.seed

        def request(ceiling: int) -> SampleRequest:
            params = SamplingParams(
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=max(body.top_k, 0),
                max_tokens=ceiling,
                stop=body.stops(),
                logprobs=logprobs,
                ignore_eos=body.ignore_eos,
                top_logprobs=top_logprobs,
            )
            lanes = tuple(LaneRequest(i, seed + i, ceiling) for i in range(body.n))
            return SampleRequest(prompt, params, lanes, share_prefix=True, messages=messages)

        whole_request = request(ceiling)
        left = backend.context_left(whole_request) if isinstance(backend, ContextWindow) else None
        if left is not None:
            where = "messages" if messages is not None else "prompt"
            if left <= 0:
                raise HTTPError(
                    400,
                    f"the {where} fill the model's context ({-left} tokens over)",
                    param=where,
                    code="context_length_exceeded",
                )
            if max_tokens is not None and max_tokens > left:
                raise HTTPError(
                    400,
                    f"{ceiling_param} = {max_tokens}, but the model's context holds only "
                    f"{left} more tokens after the {where}; ask for at most {left}",
                    param=ceiling_param,
                    code="context_length_exceeded",
                )
            if max_tokens is None and ceiling > left:
                whole_request = request(left)
        step = backend.max_lanes_per_request or body.n
        return [
            SampleRequest(
                prompt,
                whole_request.params,
                whole_request.lanes[i : i + step],
                share_prefix=True,
                messages=messages,
            )
            for i in range(0, body.n, step)
        ]

    async def sample(requests: list[SampleRequest]) -> tuple[list[Sample], dict[str, Any]]:
        samples: list[Sample] = []
        billed = Usage()
        async with admission.admit(sum(len(r.lanes) for r in requests)):
            for request in requests:
                got = whole(request, await sample_all(backend, request))
                billed += bill(got)
                samples += got
        return samples, usage_body(billed)

    async def items(
        requests: list[SampleRequest], billed: list[Usage]
    ) -> AsyncGenerator[TextDelta | Sample, None]:
        """Every request's deltas and samples in turn; each request's bill lands in `billed`."""
        for request in requests:
            got: list[Sample] = []
            async with closing(stream_of(backend, request)) as stream:
                async for item in stream:
                    if isinstance(item, Sample):
                        got.append(item)
                    yield item
            billed.append(bill(whole(request, got)))

    async def streamed(
        request: Request,
        body: ChatBody | CompletionBody,
        requests: list[SampleRequest],
        kind: str,
        prefix: str,
        shape: _Shape,
        opening: list[dict[str, Any]],
    ) -> Response:
        """Server-sent events: a chunk per delta, one closing each choice, usage, `[DONE]`."""
        rid, created = f"{prefix}-{uuid.uuid4().hex}", int(clock())
        with_usage = body.stream_options is not None and body.stream_options.include_usage
        billed: list[Usage] = []
        held = contextlib.AsyncExitStack()  # the admission, held until the stream ends
        source = items(requests, billed)

        async def start() -> tuple[TextDelta | Sample | None]:
            await held.enter_async_context(admission.admit(body.n))
            try:  # the first item before the status line: an early error keeps its own status
                return (await anext(source),)
            except StopAsyncIteration:
                return (None,)

        try:
            started = await unless_disconnected(request, stopping, start)
        except BaseException:
            await source.aclose()
            await held.aclose()
            raise
        if started is None:  # the client hung up before the first item; nobody reads this
            await source.aclose()
            await held.aclose()
            return Response(status_code=499)
        (first,) = started

        def frame(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
            chunk: dict[str, Any] = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": choices,
            }
            if with_usage:
                chunk["usage"] = usage
            return f"data: {json.dumps(chunk)}\n\n"

        def render(item: TextDelta | Sample) -> str:
            if isinstance(item, TextDelta):
                return frame([shape(item.lane, item.text, None)])
            return frame([shape(item.lane, "", item)])

        async def events() -> AsyncIterator[str]:
            async with held, closing(source):
                if opening:
                    yield frame(opening)
                try:
                    if first is not None:
                        yield render(first)
                    async for item in source:
                        yield render(item)
                except Exception as exc:  # the status line has gone: report it in-band
                    t = told(exc)
                    error = {
                        "message": t.message,
                        "type": t.kind,
                        "param": None,
                        "code": t.code,
                        "status": t.status,
                    }
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
            if with_usage:
                yield frame([], usage_body(sum(billed, Usage())))
            yield "data: [DONE]\n\n"

        return ListeningStream(
            events(),
            stopping,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def answer(
        request: Request,
        body: ChatBody | CompletionBody,
        requests: list[SampleRequest],
        kind: str,
        prefix: str,
        shape: _Shape,
        opening: list[dict[str, Any]],
    ) -> Response:
        if body.stream:
            return await streamed(
                request,
                body,
                requests,
                f"{kind}.chunk" if kind == "chat.completion" else kind,
                prefix,
                shape,
                opening,
            )
        done = await unless_disconnected(request, stopping, lambda: sample(requests))
        if done is None:  # the client hung up; its lanes were cancelled and nobody reads this
            return Response(status_code=499)
        samples, usage = done
        return JSONResponse(
            {
                "id": f"{prefix}-{uuid.uuid4().hex}",
                "object": kind,
                "created": int(clock()),
                "model": model_name,
                "choices": [shape(i, s.text, s) for i, s in enumerate(samples)],
                "usage": usage,
            }
        )

    async def models(request: Request) -> JSONResponse:
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "lanefold"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def completions(request: Request) -> Response:
        body = _validated(await read_json(request, max_body_bytes), CompletionBody)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise HTTPError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        top = body.logprobs or 0
        requests = plan(body, prompt, None, body.max_tokens, body.logprobs is not None, top_logprobs=top)

        def choice(index: int, text: str, sample: Sample | None) -> dict[str, Any]:
            return {
                "index": index,
                "text": text,
                "finish_reason": None if sample is None else sample.finish_reason,
                "logprobs": None if sample is None else completion_logprobs(sample, top),
            }

        return await answer(request, body, requests, "text_completion", "cmpl", choice, [])

    async def chat(request: Request) -> Response:
        body = _validated(await read_json(request, max_body_bytes), ChatBody)
        turns = [("system" if m.role == "developer" else m.role, m.text()) for m in body.messages]
        messages = tuple(ChatMessage(role, text) for role, text in turns)
        ceiling, param = body.max_tokens, "max_tokens"
        if body.max_completion_tokens is not None:
            ceiling, param = body.max_completion_tokens, "max_completion_tokens"
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise HTTPError(
                400, "top_logprobs: logprobs must be true to ask for top_logprobs", param="top_logprobs"
            )
        requests = plan(body, flatten_messages(turns), messages, ceiling, body.logprobs, param, top)

        def choice(index: int, text: str, sample: Sample | None) -> dict[str, Any]:
            finish = None if sample is None else sample.finish_reason
            logprobs = None if sample is None else chat_logprobs(sample, top)
            if not body.stream:
                assert sample is not None
                return {
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                    "logprobs": logprobs,
                }
            delta = {"content": text} if sample is None else {}
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

        opening = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(body.n)
        ]
        return await answer(request, body, requests, "chat.completion", "chatcmpl", choice, opening)

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        middleware=[] if api_key is None else [Middleware(KeyCheck, key=api_key)],
        exception_handlers={
            HTTPError: _on_http_error,
            LanefoldError: on_error,  # answered in place
            Exception: on_error,  # answered, then re-raised by starlette to be logged
        },
    )
    app.state.stopping, app.state.admission = stopping, admission
    return app
