"""Python binding for kite (Qwen3 inference in C and CUDA), over libkite.so with ctypes: no build step, no
dependencies beyond the standard library.

    import kite
    with kite.Model("/path/to/Qwen3-0.6B-Base") as model:           # a Hugging Face checkpoint directory
        print(model.generate("The capital of France is", max_tokens=16).text)
        for piece in model.stream("Once upon a time", max_tokens=32, temperature=0.7, seed=1):
            print(piece, end="", flush=True)
        results = model.generate_batch(["a prompt", "another"], max_tokens=8)   # one continuous batch

The library is found through $KITE_LIBRARY, then build/libkite.so beside this package's checkout, then the
system's library path. Errors raise kite.KiteError with kite's one-line message.
"""
import ctypes
import ctypes.util
import json
import os
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Union

__all__ = ["KiteError", "Model", "Completion", "TokenLogprob", "ChatCompletion", "ChatDelta", "ToolCall",
           "load_library"]

# ---- the C structs of include/kite.h, field for field --------------------------------------------------

c_int32, c_int64, c_uint64, c_size_t = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t


class _LoadParams(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("n_threads", c_int32), ("device", c_int32)]


class _ModelInfo(ctypes.Structure):
    _fields_ = [("vocab_size", c_int32), ("n_layers", c_int32), ("hidden_size", c_int32), ("max_context", c_int32),
                ("n_eos_ids", c_int32), ("eos_ids", ctypes.POINTER(c_int32)), ("has_tokenizer", ctypes.c_bool),
                ("backend_name", ctypes.c_char_p), ("n_parameters", c_size_t)]


class _Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", c_int32), ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float), ("repetition_penalty", ctypes.c_float), ("seed", c_uint64)]


class _TokenEvent(ctypes.Structure):
    _fields_ = [("request", c_int64), ("token", c_int32), ("text", ctypes.POINTER(ctypes.c_char)),
                ("text_length", c_size_t), ("logprob", ctypes.c_float), ("n_top", c_int32),
                ("top_ids", ctypes.POINTER(c_int32)), ("top_logprobs", ctypes.POINTER(ctypes.c_float)),
                ("finish", ctypes.c_int)]


_TokenCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(_TokenEvent), ctypes.c_void_p)


class _Request(ctypes.Structure):
    _fields_ = [("prompt_ids", ctypes.POINTER(c_int32)), ("n_prompt_ids", c_size_t),
                ("prompt_text", ctypes.c_char_p), ("prompt_text_length", c_size_t), ("sampling", _Sampling),
                ("max_tokens", c_int32), ("stop_strings", ctypes.POINTER(ctypes.c_char_p)),
                ("n_stop_strings", c_int32), ("stop_ids", ctypes.POINTER(c_int32)), ("n_stop_ids", c_int32),
                ("ignore_eos", ctypes.c_bool), ("n_logprobs", c_int32),
                ("on_token", _TokenCallback), ("user_data", ctypes.c_void_p)]


class _ChatPrompt(ctypes.Structure):
    _fields_ = [("text", ctypes.POINTER(ctypes.c_char)), ("length", c_size_t), ("ids", ctypes.POINTER(c_int32)),
                ("n_ids", c_size_t), ("thinking", ctypes.c_bool), ("starts_in_reasoning", ctypes.c_bool),
                ("has_tools", ctypes.c_bool)]


class _ToolCall(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char_p), ("name", ctypes.c_char_p), ("arguments", ctypes.c_char_p)]


class _ChatDelta(ctypes.Structure):
    _fields_ = [("reasoning", ctypes.POINTER(ctypes.c_char)), ("reasoning_length", c_size_t),
                ("content", ctypes.POINTER(ctypes.c_char)), ("content_length", c_size_t),
                ("tool_calls", ctypes.POINTER(_ToolCall)), ("n_tool_calls", c_size_t)]


class _ChatEvent(ctypes.Structure):
    _fields_ = [("request", c_int64), ("delta", _ChatDelta), ("token", ctypes.POINTER(_TokenEvent)),
                ("finish", ctypes.c_int)]


_ChatCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ChatEvent), ctypes.c_void_p)


class _EngineParams(ctypes.Structure):
    _fields_ = [("max_sequences", c_int32), ("max_step_tokens", c_int32), ("kv_cache_bytes", c_size_t),
                ("kv_cache_fraction", ctypes.c_float), ("max_context", c_int32), ("kv_block_size", c_int32)]


class _EngineStats(ctypes.Structure):
    _fields_ = [("kv_block_size", c_int32), ("kv_blocks_total", c_int32), ("kv_blocks_free", c_int32),
                ("kv_capacity_tokens", c_size_t), ("max_concurrent_full", c_int32), ("max_context", c_int32),
                ("running", c_int32), ("waiting", c_int32), ("preemptions", c_int64), ("steps", c_int64),
                ("steps_ahead", c_int64)]


_BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
# Generation options and their defaults (greedy, up to 128 new tokens), shared by generate, generate_batch
# and stream.
_DEFAULT_OPTIONS = {"max_tokens": 128, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                    "repetition_penalty": 1.0, "seed": 0, "stop": (), "ignore_eos": False, "logprobs": 0}
_FINISH = {0: None, 1: "length", 2: "stop", 3: "cancelled", 4: "capacity"}
_MAX_LOGPROBS = 20  # KITE_MAX_LOGPROBS


class KiteError(RuntimeError):
    """A kite call failed; the message is kite's (it names the file, tensor, field or argument)."""


# ---- the library --------------------------------------------------------------------------------------

_lib = None


def _declare(lib):
    p = ctypes.POINTER
    signatures = {
        "kite_last_error": (ctypes.c_char_p, []),
        "kite_free": (None, [ctypes.c_void_p]),
        "kite_built_with_cuda": (ctypes.c_bool, []),
        "kite_load_params_default": (_LoadParams, []),
        "kite_model_load": (ctypes.c_int, [ctypes.c_char_p, p(_LoadParams), p(ctypes.c_void_p)]),
        "kite_model_load_dummy": (ctypes.c_int, [ctypes.c_char_p, c_uint64, p(_LoadParams), p(ctypes.c_void_p)]),
        "kite_model_free": (None, [ctypes.c_void_p]),
        "kite_model_get_info": (_ModelInfo, [ctypes.c_void_p]),
        "kite_tokenize": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, c_size_t, p(p(c_int32)), p(c_size_t)]),
        "kite_detokenize": (ctypes.c_int, [ctypes.c_void_p, p(c_int32), c_size_t, p(ctypes.c_void_p), p(c_size_t)]),
        "kite_sampling_default": (_Sampling, []),
        "kite_request_default": (_Request, []),
        "kite_engine_params_default": (_EngineParams, []),
        "kite_engine_create": (ctypes.c_int, [ctypes.c_void_p, p(_EngineParams), p(ctypes.c_void_p)]),
        "kite_engine_free": (None, [ctypes.c_void_p]),
        "kite_engine_submit": (ctypes.c_int, [ctypes.c_void_p, p(_Request), p(c_int64)]),
        "kite_engine_cancel": (ctypes.c_int, [ctypes.c_void_p, c_int64]),
        "kite_engine_step": (ctypes.c_int, [ctypes.c_void_p]),
        "kite_engine_run": (ctypes.c_int, [ctypes.c_void_p]),
        "kite_engine_idle": (ctypes.c_bool, [ctypes.c_void_p]),
        "kite_engine_get_stats": (_EngineStats, [ctypes.c_void_p]),
        "kite_model_chat": (ctypes.c_void_p, [ctypes.c_void_p]),
        "kite_chat_render": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, c_size_t, p(_ChatPrompt)]),
        "kite_chat_prompt_free": (None, [p(_ChatPrompt)]),
        "kite_chat_sampling_defaults": (_Sampling, [ctypes.c_void_p]),
        "kite_chat_submit": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, p(_ChatPrompt), p(_Request),
                                            _ChatCallback, ctypes.c_void_p, p(c_int64)]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def load_library(path: Optional[str] = None):
    """Loads libkite.so (once); `path` or $KITE_LIBRARY override the search."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    candidates = [path, os.environ.get("KITE_LIBRARY")]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "build", "libkite.so"))
    candidates.append(ctypes.util.find_library("kite"))
    tried = []
    for candidate in candidates:
        if not candidate:
            continue
        if os.sep in candidate and not os.path.exists(candidate):
            tried.append(candidate + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            tried.append(f"{candidate} ({e})")
            continue
        _declare(lib)
        _lib = lib
        return lib
    raise KiteError("kite: libkite.so not found; set KITE_LIBRARY (tried: " + "; ".join(tried or ["nothing"]) + ")")


def _check(status: int):
    if status != 0:
        message = _lib.kite_last_error()
        raise KiteError(message.decode("utf-8", "replace") if message else f"kite: status {status}")


# ---- results ----------------------------------------------------------------------------------------------

@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: List[tuple] = field(default_factory=list)  # [(id, logprob), ...] best first


@dataclass
class Completion:
    text: str = ""
    tokens: List[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "length", "stop", "cancelled", "capacity"
    logprobs: List[TokenLogprob] = field(default_factory=list)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as vLLM's hermes parser gives it


@dataclass
class ChatDelta:
    """What one step of a chat answer added (Model.chat(..., stream=True) yields these)."""
    content: str = ""
    reasoning: str = ""
    tool_calls: List[ToolCall] = field(default_factory=list)
    finish_reason: Optional[str] = None


@dataclass
class ChatCompletion:
    content: str = ""
    reasoning: str = ""  # what the model wrote inside <think>...</think> (reasoning_content)
    tool_calls: List[ToolCall] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "stop", "length", "cancelled", "capacity"
    prompt: str = ""  # the rendered prompt


# ---- the model ----------------------------------------------------------------------------------------------

class Model:
    """A loaded Qwen3 checkpoint and the engine that generates with it (created on first use)."""

    def __init__(self, path: Optional[str] = None, *, backend: str = "auto", threads: int = 0, device: int = 0,
                 dummy: Optional[str] = None, seed: int = 0, library: Optional[str] = None,
                 kv_cache_mb: Optional[int] = None, max_context: int = 0, max_sequences: int = 0):
        lib = load_library(library)
        if backend not in _BACKENDS:
            raise KiteError(f"kite: backend {backend!r} is not one of {', '.join(_BACKENDS)}")
        if (path is None) == (dummy is None):
            raise KiteError("kite: give a checkpoint directory or dummy=SHAPE, not both and not neither")
        params = lib.kite_load_params_default()
        params.backend, params.n_threads, params.device = _BACKENDS[backend], threads, device
        handle = ctypes.c_void_p()
        if dummy is not None:
            _check(lib.kite_model_load_dummy(dummy.encode(), seed, ctypes.byref(params), ctypes.byref(handle)))
        else:
            _check(lib.kite_model_load(os.fsencode(path), ctypes.byref(params), ctypes.byref(handle)))
        self._lib, self._handle, self._engine = lib, handle, None
        self._engine_params = lib.kite_engine_params_default()
        if kv_cache_mb:
            self._engine_params.kv_cache_bytes = int(kv_cache_mb) << 20
        if max_context:
            self._engine_params.max_context = max_context
        if max_sequences:
            self._engine_params.max_sequences = max_sequences
        info = lib.kite_model_get_info(handle)
        self.info = {
            "vocab_size": info.vocab_size, "n_layers": info.n_layers, "hidden_size": info.hidden_size,
            "max_context": info.max_context, "eos_ids": [info.eos_ids[i] for i in range(info.n_eos_ids)],
            "has_tokenizer": bool(info.has_tokenizer), "backend": info.backend_name.decode(),
            "n_parameters": info.n_parameters,
        }

    # lifetime
    def close(self):
        if getattr(self, "_engine", None):
            self._lib.kite_engine_free(self._engine)
            self._engine = None
        if getattr(self, "_handle", None):
            self._lib.kite_model_free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _model(self):
        if not self._handle:
            raise KiteError("kite: the model is closed")
        return self._handle

    # tokenizer
    def tokenize(self, text: str) -> List[int]:
        data = text.encode("utf-8")
        ids, n = ctypes.POINTER(c_int32)(), c_size_t()
        _check(self._lib.kite_tokenize(self._model(), data, len(data), ctypes.byref(ids), ctypes.byref(n)))
        try:
            return ids[: n.value]
        finally:
            self._lib.kite_free(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        array = (c_int32 * len(ids))(*ids)
        text, n = ctypes.c_void_p(), c_size_t()
        _check(self._lib.kite_detokenize(self._model(), array, len(ids), ctypes.byref(text), ctypes.byref(n)))
        try:
            return ctypes.string_at(text, n.value).decode("utf-8") if n.value else ""
        finally:
            self._lib.kite_free(text)

    # generation
    def _engine_handle(self):
        if self._engine is None:
            handle = ctypes.c_void_p()
            _check(self._lib.kite_engine_create(self._model(), ctypes.byref(self._engine_params), ctypes.byref(handle)))
            self._engine = handle
        return self._engine

    def engine_stats(self) -> dict:
        stats = self._lib.kite_engine_get_stats(self._engine_handle())
        return {name: getattr(stats, name) for name, _ in _EngineStats._fields_}

    def _submit(self, prompt: Union[str, Sequence[int]], on_event, options: dict):
        unknown = set(options) - set(_DEFAULT_OPTIONS)
        if unknown:
            raise KiteError("kite: unknown generation option(s) " + ", ".join(sorted(unknown)))
        o = {**_DEFAULT_OPTIONS, **options}
        logprobs, stop = o["logprobs"], o["stop"]
        if not 0 <= logprobs <= _MAX_LOGPROBS:
            raise KiteError(f"kite: logprobs {logprobs} is outside [0, {_MAX_LOGPROBS}]")
        request = self._lib.kite_request_default()
        keep = []  # everything the request points at stays alive until the submit has copied it
        if isinstance(prompt, str):
            data = prompt.encode("utf-8")
            request.prompt_text, request.prompt_text_length = data, len(data)
            keep.append(data)
        else:
            ids = (c_int32 * len(prompt))(*prompt)
            request.prompt_ids, request.n_prompt_ids = ids, len(prompt)
            keep.append(ids)
        s = request.sampling
        s.temperature, s.top_k, s.top_p, s.min_p = o["temperature"], o["top_k"], o["top_p"], o["min_p"]
        s.repetition_penalty, s.seed = o["repetition_penalty"], o["seed"]
        request.max_tokens, request.ignore_eos, request.n_logprobs = o["max_tokens"], o["ignore_eos"], logprobs
        if stop:
            encoded = [x.encode("utf-8") for x in stop]
            strings = (ctypes.c_char_p * len(encoded))(*encoded)
            request.stop_strings, request.n_stop_strings = strings, len(encoded)
            keep.extend([encoded, strings])
        request.on_token = on_event
        request_id = c_int64()
        _check(self._lib.kite_engine_submit(self._engine_handle(), ctypes.byref(request), ctypes.byref(request_id)))
        return request_id.value

    @staticmethod
    def _collector(results: dict):
        """A C callback that appends each event to results[request id] (a Completion) and its text pieces."""
        def on_event(event_pointer, _user_data):
            e = event_pointer.contents
            completion, pieces = results.setdefault(e.request, (Completion(), []))
            piece = ctypes.string_at(e.text, e.text_length).decode("utf-8") if e.text_length else ""
            if piece:
                completion.text += piece
                pieces.append(piece)
            if e.token >= 0:
                completion.tokens.append(e.token)
                if e.n_top > 0:
                    top = [(e.top_ids[i], e.top_logprobs[i]) for i in range(e.n_top)]
                    completion.logprobs.append(TokenLogprob(e.token, e.logprob, top))
            if e.finish:
                completion.finish_reason = _FINISH.get(e.finish, str(e.finish))
        return _TokenCallback(on_event)

    def generate_batch(self, prompts: Sequence[Union[str, Sequence[int]]], **options) -> List[Completion]:
        """Runs every prompt as one continuous batch; returns their completions in order. Options (defaults
        in _DEFAULT_OPTIONS): max_tokens, temperature (0 = greedy), top_k, top_p, min_p, repetition_penalty,
        seed, stop (strings), ignore_eos, logprobs (top-K per token, at most 20)."""
        results = {}
        callback = self._collector(results)
        ids = [self._submit(p, callback, options) for p in prompts]
        _check(self._lib.kite_engine_run(self._engine_handle()))
        return [results.get(i, (Completion(), []))[0] for i in ids]

    def generate(self, prompt: Union[str, Sequence[int]], **options) -> Completion:
        """One prompt (text or token ids) to its completion; options as generate_batch."""
        return self.generate_batch([prompt], **options)[0]

    def stream(self, prompt: Union[str, Sequence[int]], **options) -> Iterator[str]:
        """Yields the completion's text as it is produced (the pieces concatenate to generate()'s text)."""
        results = {}
        callback = self._collector(results)
        request_id = self._submit(prompt, callback, options)
        engine = self._engine_handle()
        try:
            while True:
                _check(self._lib.kite_engine_step(engine))
                completion, pieces = results.get(request_id, (None, []))
                while pieces:
                    yield pieces.pop(0)
                if completion is not None and completion.finish_reason is not None:
                    return
                if self._lib.kite_engine_idle(engine):
                    return
        finally:  # a consumer that stops early cancels the request, so the engine is left idle
            entry = results.get(request_id)
            if entry is None or entry[0].finish_reason is None:
                self._lib.kite_engine_cancel(engine, request_id)
                _check(self._lib.kite_engine_run(engine))

    # chat
    def _chat_handle(self):
        chat = self._lib.kite_model_chat(self._model())
        if not chat:
            raise KiteError("kite: this checkpoint has no chat template")
        return chat

    @staticmethod
    def _chat_body(messages, tools, enable_thinking, add_generation_prompt, template_kwargs) -> bytes:
        body = {"messages": list(messages), "add_generation_prompt": add_generation_prompt,
                "chat_template_kwargs": {**(template_kwargs or {}), "enable_thinking": enable_thinking}}
        if tools:
            body["tools"] = list(tools)
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    def render_chat(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None, *,
                    enable_thinking: bool = True, add_generation_prompt: bool = True,
                    template_kwargs: Optional[dict] = None) -> str:
        """The prompt the checkpoint's chat template renders for OpenAI-style messages (and tools)."""
        prompt = _ChatPrompt()
        data = self._chat_body(messages, tools, enable_thinking, add_generation_prompt, template_kwargs)
        _check(self._lib.kite_chat_render(self._chat_handle(), data, len(data), ctypes.byref(prompt)))
        try:
            return ctypes.string_at(prompt.text, prompt.length).decode("utf-8")
        finally:
            self._lib.kite_chat_prompt_free(ctypes.byref(prompt))

    _SAMPLING_NAMES = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
    _CHAT_OPTIONS = set(_SAMPLING_NAMES) | {"max_tokens", "seed", "stop"}

    def _chat_events(self, messages, tools, enable_thinking, template_kwargs, options):
        """Submits the chat answer and yields (ChatDelta, prompt text) as the engine produces them."""
        unknown = set(options) - self._CHAT_OPTIONS
        if unknown:
            raise KiteError("kite: unknown chat option(s) " + ", ".join(sorted(unknown)))
        chat = self._chat_handle()
        prompt = _ChatPrompt()
        data = self._chat_body(messages, tools, enable_thinking, True, template_kwargs)
        _check(self._lib.kite_chat_render(chat, data, len(data), ctypes.byref(prompt)))
        text = ctypes.string_at(prompt.text, prompt.length).decode("utf-8")
        request = self._lib.kite_request_default()
        # Sampling the request leaves unset follows generation_config.json; no seed draws a fresh one.
        request.sampling = self._lib.kite_chat_sampling_defaults(chat)
        for name in self._SAMPLING_NAMES:
            if options.get(name) is not None:
                setattr(request.sampling, name, options[name])
        seed = options.get("seed")
        request.sampling.seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        request.max_tokens = options.get("max_tokens") or 0
        keep = []
        stop = options.get("stop") or ()
        if stop:
            encoded = [x.encode("utf-8") for x in stop]
            strings = (ctypes.c_char_p * len(encoded))(*encoded)
            request.stop_strings, request.n_stop_strings = strings, len(encoded)
            keep.extend([encoded, strings])
        deltas = []

        def on_event(event_pointer, _user_data):
            e = event_pointer.contents
            d = e.delta
            calls = [ToolCall(d.tool_calls[i].id.decode(), d.tool_calls[i].name.decode("utf-8"),
                              d.tool_calls[i].arguments.decode("utf-8")) for i in range(d.n_tool_calls)]
            deltas.append(ChatDelta(
                content=ctypes.string_at(d.content, d.content_length).decode("utf-8") if d.content_length else "",
                reasoning=(ctypes.string_at(d.reasoning, d.reasoning_length).decode("utf-8")
                           if d.reasoning_length else ""),
                tool_calls=calls, finish_reason=_FINISH.get(e.finish, str(e.finish)) if e.finish else None))

        callback = _ChatCallback(on_event)
        engine = self._engine_handle()
        request_id = c_int64()
        try:
            _check(self._lib.kite_chat_submit(engine, chat, ctypes.byref(prompt), ctypes.byref(request),
                                              callback, None, ctypes.byref(request_id)))
        finally:
            self._lib.kite_chat_prompt_free(ctypes.byref(prompt))
        finished = False
        try:
            while not finished:
                while deltas:
                    delta = deltas.pop(0)
                    finished = finished or delta.finish_reason is not None
                    yield delta, text
                if finished or self._lib.kite_engine_idle(engine):
                    return
                _check(self._lib.kite_engine_step(engine))
        finally:  # a consumer that stops early cancels the answer, so the engine is left idle
            if not finished:
                self._lib.kite_engine_cancel(engine, request_id.value)
                _check(self._lib.kite_engine_run(engine))

    def chat(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None, *, enable_thinking: bool = True,
             stream: bool = False, template_kwargs: Optional[dict] = None, **options):
        """Answers OpenAI-style messages through the checkpoint's chat template. Returns a ChatCompletion
        (content, reasoning, tool_calls), or with stream=True yields ChatDelta pieces as they are generated.
        Options: max_tokens (default: until the turn ends), temperature, top_k, top_p, min_p,
        repetition_penalty (unset ones follow generation_config.json), seed (default: a fresh one), stop."""
        events = self._chat_events(messages, tools, enable_thinking, template_kwargs, options)
        if stream:
            return (delta for delta, _ in events)
        result = ChatCompletion()
        for delta, text in events:
            result.prompt = text
            result.content += delta.content
            result.reasoning += delta.reasoning
            result.tool_calls.extend(delta.tool_calls)
            if delta.finish_reason:
                result.finish_reason = delta.finish_reason
        return result
