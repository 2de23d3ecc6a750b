"""The simulated server's HTTP API over one engine: each route a method, each answer as SGLang gives it (plus
``simulated``): SGLang's native /generate, OpenAI's chat and text completions, health, model and server info,
metrics and the prefix cache's flush."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import time
import traceback

from aiohttp import web

from .. import __version__
from ..text import chat_template
from ..workloads import WorkloadError, tokenizer
from .engine import Engine, Request
from .stream import EventStream


def _crash_on_engine_error(task: asyncio.Task) -> None:
    """Like a real server whose scheduler fails: say why and exit, never hang with requests pending."""
    if not task.cancelled() and task.exception() is not None:
        traceback.print_exception(task.exception())
        print("engine loop failed; exiting", flush=True)
        os._exit(1)


class SimServer:
    """The HTTP API over one engine: each route a method, each answer as SGLang gives it (plus ``simulated``)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.engine = args, Engine(args)
        self.model_name = args.served_model_name or args.model_path
        self.launched = time.time()
        self.ids = iter(range(1, 1 << 62))
        self.generate_requests = 0
        self.fault_rng = random.Random(f"faults:{args.random_seed}")

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids, with the model's tokenizer where it is a local folder, else the Qwen tokenizer
        shipped with the workload data; placeholder words where neither is installed."""
        try:
            return tokenizer(self.args.model_path).decode(token_ids)
        except (ImportError, WorkloadError):
            return " ".join(f"t{i}" for i in token_ids)

    @staticmethod
    async def wait_done(req: Request) -> None:
        """Until the engine's last step for a request (non-streaming answers read the whole reply after it)."""
        while not (await req.queue.get()).done:
            pass

    def usage(self, req: Request, produced: int | None = None) -> dict:
        """OpenAI usage; as SGLang, cached prompt tokens are reported only with --enable-cache-report."""
        details = {"cached_tokens": req.cached_tokens} if getattr(self.args, "enable_cache_report", False) else None
        produced = req.produced if produced is None else produced
        return {
            "prompt_tokens": req.length,
            "completion_tokens": produced,
            "total_tokens": req.length + produced,
            "prompt_tokens_details": details,
        }

    @contextlib.asynccontextmanager
    async def abort_when_gone(self, req: Request):
        """Around a streamed answer: where it ends before the request's last step (the client went away, so a write
        to its stream failed, or the handler was cancelled), the engine stops the request (Engine.abort), as SGLang's
        HTTP server aborts a streaming request whose client disconnects (the abort task of its /generate and OpenAI
        routes). The handler notices at its next write: a request still queued when its client leaves is admitted
        and aborted at its first chunk (SGLang too notices at a write, or at its periodic check)."""
        try:
            yield
        finally:
            self.engine.abort(req)  # nothing where the request has ended

    @web.middleware
    async def require_key(self, request, handler):
        if self.args.api_key and request.path != "/health":
            if request.headers.get("Authorization", "") != f"Bearer {self.args.api_key}":
                return web.json_response({"error": "invalid or missing API key"}, status=401)
        return await handler(request)

    async def start_engine(self, app) -> None:
        app["engine_task"] = asyncio.create_task(self.engine.run())
        app["engine_task"].add_done_callback(_crash_on_engine_error)

    async def stop_engine(self, app) -> None:
        app["engine_task"].cancel()

    async def health(self, request):
        return web.Response(text="")

    async def health_generate(self, request):
        if self.args.sim_never_ready:
            raise web.HTTPServiceUnavailable(text="fault: never ready (--sim-never-ready)")
        req = self.engine.submit("<|im_start|>user\nhello<|im_end|>\n", {"max_new_tokens": 1, "temperature": 0})
        await self.wait_done(req)
        return web.Response(text="")

    async def model_info(self, request):
        return web.json_response(
            {
                "model_path": self.args.model_path,
                "tokenizer_path": self.args.model_path,
                "is_generation": True,
                "simulated": True,
            }
        )

    async def server_info(self, request):
        engine = self.engine
        verify = engine.counters["verify_calls"]
        avg = engine.counters["accepted_tokens"] / verify if verify else None
        info = {k.replace("-", "_"): v for k, v in vars(self.args).items()}
        info["chunked_prefill_size"] = engine.chunk  # as resolved (SGLang reports its own choice)
        decoding = engine.decoding
        shape = decoding.tree_shape()
        if shape:  # what the DDTree build runs at this budget
            info.update({"ddtree_build": decoding.tree_build, "ddtree_mode": shape[0], "ddtree_width": shape[1]})
        if decoding.spec.drafting in ("draft-model", "lookup"):  # the settings as SGLang resolved them
            topk = (decoding.topk or 1) if decoding.spec.drafting == "draft-model" else decoding.max_bfs_breadth
            info.update(
                {
                    "speculative_num_draft_tokens": decoding.num_draft_tokens,
                    "speculative_eagle_topk": topk,
                    "speculative_num_steps": decoding.num_steps or decoding.num_draft_tokens // topk,
                }
            )
            if decoding.spec.drafting == "lookup":
                info.update(
                    {
                        "speculative_ngram_max_bfs_breadth": decoding.max_bfs_breadth,
                        "speculative_ngram_match_type": decoding.match_type,
                    }
                )
        info.update(
            {
                "version": f"specsweep-sim {__version__}",
                "simulated": True,
                "sim_clock": engine.clock.report(),
                "internal_states": [{"avg_spec_accept_length": avg, "launched_at": self.launched}],
            }
        )
        return web.json_response(info)

    async def flush_cache(self, request):
        self.engine.flush()
        return web.Response(text="Cache flushed.\n")

    async def metrics(self, request):
        if not self.args.enable_metrics:
            raise web.HTTPNotFound(text="metrics are disabled; start with --enable-metrics")
        engine = self.engine
        escaped = self.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # as Prometheus asks
        c, label = engine.counters, f'{{model_name="{escaped}"}}'
        lines = []
        for name, value, kind in (
            ("sglang:prompt_tokens_total", c["prompt_tokens"], "counter"),
            ("sglang:generation_tokens_total", c["generation_tokens"], "counter"),
            ("sglang:num_requests_total", c["requests"], "counter"),
            ("sglang:cached_tokens_total", c["cached_tokens"], "counter"),
            ("sglang:spec_verify_calls_total", c["verify_calls"], "counter"),
            ("sglang:num_retracted_requests_total", 0, "counter"),
            ("sglang:cuda_graph_passes_total", c["steps"], "counter"),
            ("sglang:num_running_reqs", len(engine.running), "gauge"),
            ("sglang:num_queue_reqs", len(engine.waiting), "gauge"),
            ("specsweep_sim:aborted_requests_total", c["aborted_requests"], "counter"),
            ("specsweep_sim:steps_late_total", engine.clock.steps_late, "counter"),
            ("specsweep_sim:late_seconds_total", engine.clock.late_seconds, "counter"),
            ("specsweep_sim:scheduled_seconds_total", engine.clock.scheduled_seconds, "counter"),
        ):
            lines += [f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
        lines.append("# specsweep simulated backend")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def generate(self, request):
        """SGLang's native /generate: text or token ids in; one chunk per engine step when streaming."""
        args, engine = self.args, self.engine
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text="request body is not JSON")
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is None and isinstance(input_ids, list) and input_ids and all(isinstance(i, int) for i in input_ids):
            text = self.decode(input_ids)  # SGLang's own client sends token ids with --tokenize-prompt
        elif not isinstance(text, str):
            raise web.HTTPBadRequest(
                text="the simulated server accepts 'text' (one string) or 'input_ids' (one list of token ids) only"
            )
        else:
            input_ids = None
        sampling = body.get("sampling_params") or {}
        self.generate_requests += 1
        if args.sim_crash_after and self.generate_requests >= args.sim_crash_after:
            print(f"fault: crashing at request {self.generate_requests} (--sim-crash-after)", flush=True)
            os._exit(3)
        if args.sim_error_rate and self.fault_rng.random() < args.sim_error_rate:
            return web.json_response(
                {"error": {"message": "fault: injected internal error (--sim-error-rate)"}}, status=500
            )
        truncate = bool(args.sim_truncate_rate) and self.fault_rng.random() < args.sim_truncate_rate
        try:
            req = engine.submit(text, sampling, input_ids)
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        rid = f"sim-{next(self.ids)}"
        if not body.get("stream"):
            await self.wait_done(req)
            return web.json_response({"text": "".join(req.reply), "meta_info": engine.meta_info(req, rid)})
        async with self.abort_when_gone(req):
            stream = await EventStream.open(request)
            done, sent = False, 0
            incremental = bool(getattr(args, "incremental_streaming_output", False))
            while not done:  # one chunk per engine step, as SGLang streams
                step = await req.queue.get()
                done = step.done
                if args.sim_hang_after_tokens and step.produced >= args.sim_hang_after_tokens:
                    await asyncio.sleep(3600)  # fault: the stream goes silent, the connection stays open
                if truncate and step.produced * 2 >= len(req.reply):
                    request.transport.close()  # fault: the stream is cut mid-way
                    return stream.response
                # as SGLang: the whole text so far, or with --incremental-streaming-output only the new segment
                text = "".join(req.reply[sent if incremental else 0 : step.produced])
                sent = step.produced
                await stream.send({"text": text, "meta_info": engine.meta_info(req, rid, step)})
            return await stream.close()

    async def openai(self, request, chat: bool):
        """/v1/chat/completions (chat) and /v1/completions, streaming or not."""
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text="request body is not JSON")
        prompt = self.openai_prompt(body, chat)
        sampling = {
            "max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 128,
            "temperature": body.get("temperature", 1.0),
            "ignore_eos": body.get("ignore_eos", False),
        }
        try:
            req = self.engine.submit(prompt, sampling)
        except ValueError as exc:
            return web.json_response({"object": "error", "message": str(exc), "code": 400}, status=400)
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"sim-{next(self.ids)}", "object": kind, "created": int(time.time()), "model": self.model_name}
        if not body.get("stream"):
            await self.wait_done(req)
            text = "".join(req.reply)
            finish = "stop" if req.natural_stop else "length"
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            return web.json_response({**head, "choices": [choice], "usage": self.usage(req), "simulated": True})
        async with self.abort_when_gone(req):
            return await self.openai_stream(request, req, head, chat, body.get("stream_options") or {})

    def openai_prompt(self, body: dict, chat: bool) -> str:
        """The prompt of an OpenAI request: the chat's messages in the model folder's chat template, as SGLang applies
        it (Qwen ChatML without one), or the completion's one string (HTTP 400 otherwise)."""
        if chat:
            thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            try:
                return chat_template(self.args.model_path).render(body.get("messages") or [], thinking)
            except ValueError as exc:
                raise web.HTTPBadRequest(text=str(exc))
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise web.HTTPBadRequest(text="the simulated server accepts one string prompt")
        return prompt

    async def openai_stream(self, request, req: Request, head: dict, chat: bool, options: dict):
        """An OpenAI stream: one chunk per engine step (a chat's first chunk carries the role only), usage in every
        chunk with ``continuous_usage_stats`` and in a last chunk with ``include_usage``."""
        stream = await EventStream.open(request)
        head = {**head, "object": head["object"] + ".chunk" if chat else head["object"]}
        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await stream.send({**head, "choices": [role]})
        sent, done = 0, False
        while not done:  # one chunk per engine step
            step = await req.queue.get()
            done = step.done
            text = "".join(req.reply[sent : step.produced])
            sent = step.produced
            finish = ("stop" if req.natural_stop else "length") if done else None
            choice = (
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            payload = {**head, "choices": [choice]}
            if options.get("continuous_usage_stats"):
                payload["usage"] = self.usage(req, step.produced)
            await stream.send(payload)
        if options.get("include_usage"):
            await stream.send({**head, "choices": [], "usage": self.usage(req)})
        return await stream.close()

    async def chat_completions(self, request):
        return await self.openai(request, chat=True)

    async def completions(self, request):
        return await self.openai(request, chat=False)

    async def models(self, request):
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(self.launched),
                        "owned_by": "specsweep-sim",
                    }
                ],
            }
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.require_key])
        app.on_startup.append(self.start_engine)
        app.on_cleanup.append(self.stop_engine)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/model_info", self.model_info)  # the newer name, which SGLang's bench_serving asks for
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/generate", self.generate)
        return app


def build_app(args: argparse.Namespace) -> web.Application:
    return SimServer(args).app()
