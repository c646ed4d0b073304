"""Python binding for kite (Qwen3 inference in C and CUDA), over libkite.so with ctypes: no build step, no
dependencies beyond the standard library.

    import kite
    with kite.Model("/path/to/Qwen3-0.6B-Base") as model:           # a Hugging Face checkpoint directory
        print(model.generate("The capital of France is", max_tokens=16).text)
        for piece in model.stream("Once upon a time", max_tokens=32, temperature=0.7, seed=1):
            print(piece, end="", flush=True)
        results = model.generate_batch(["a prompt", "another"], max_tokens=8)   # one continuous batch

The library is found through $KITE_LIBRARY, then build/libkite.so beside this package's checkout, then the
system's library path. Errors raise kite.KiteError with kite's one-line message; arguments are checked before
they reach C (an integer out of its C type's range, a bool for a number, a NUL in a C string is an error).
A Model may be shared by threads (its calls take turns); a stream used after close() raises KiteError.
"""
import ctypes
import ctypes.util
import json
import math
import numbers
import os
import threading
from collections import abc
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Union

__all__ = ["KiteError", "Model", "Completion", "TokenLogprob", "ChatCompletion", "ChatDelta", "ToolCall",
           "load_library"]

# ---- the C structs of include/kite.h, field for field --------------------------------------------------

c_int32, c_int64, c_uint64, c_size_t = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t


class _LoadParams(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("n_threads", c_int32), ("device", c_int32), ("weights", ctypes.c_int),
                ("kv_cache_dtype", ctypes.c_int), ("max_context", c_int32), ("rope_scaling", ctypes.c_char_p),
                ("weight_cache", ctypes.c_char_p),
                # on_load_event stays NULL: the library then prints a load's notices (a rebuilt weight cache
                # entry) to stderr itself, and Python has no progress to show
                ("on_load_event", ctypes.c_void_p), ("load_event_user_data", ctypes.c_void_p)]


class _ModelInfo(ctypes.Structure):
    _fields_ = [("vocab_size", c_int32), ("n_layers", c_int32), ("hidden_size", c_int32), ("max_context", c_int32),
                ("n_eos_ids", c_int32), ("eos_ids", ctypes.POINTER(c_int32)), ("has_tokenizer", ctypes.c_bool),
                ("backend_name", ctypes.c_char_p), ("n_parameters", c_size_t)]


class _Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", c_int32), ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float), ("repetition_penalty", ctypes.c_float), ("seed", c_uint64),
                ("fresh_seed", ctypes.c_bool), ("presence_penalty", ctypes.c_float),
                ("frequency_penalty", ctypes.c_float)]


class _LogitBias(ctypes.Structure):
    _fields_ = [("token", c_int32), ("bias", ctypes.c_float)]


class _TokenEvent(ctypes.Structure):
    _fields_ = [("request", c_int64), ("token", c_int32), ("text", ctypes.POINTER(ctypes.c_char)),
                ("text_length", c_size_t), ("logprob", ctypes.c_float), ("n_top", c_int32),
                ("top_ids", ctypes.POINTER(c_int32)), ("top_logprobs", ctypes.POINTER(ctypes.c_float)),
                ("finish", ctypes.c_int), ("error", ctypes.c_char_p),
                ("inserted_ids", ctypes.POINTER(c_int32)), ("n_inserted", c_int32)]


_TokenCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(_TokenEvent), ctypes.c_void_p)


class _Request(ctypes.Structure):
    _fields_ = [("prompt_ids", ctypes.POINTER(c_int32)), ("n_prompt_ids", c_size_t),
                ("prompt_text", ctypes.c_char_p), ("prompt_text_length", c_size_t), ("sampling", _Sampling),
                ("max_tokens", c_int32), ("stop_strings", ctypes.POINTER(ctypes.c_char_p)),
                ("n_stop_strings", c_int32), ("stop_ids", ctypes.POINTER(c_int32)), ("n_stop_ids", c_int32),
                ("ignore_eos", ctypes.c_bool), ("min_tokens", c_int32),
                ("logit_bias", ctypes.POINTER(_LogitBias)), ("n_logit_bias", c_int32), ("n_logprobs", c_int32),
                ("insert_after", c_int32), ("insert_ids", ctypes.POINTER(c_int32)), ("n_insert_ids", c_int32),
                ("on_token", _TokenCallback), ("user_data", ctypes.c_void_p)]


class _ChatPrompt(ctypes.Structure):
    _fields_ = [("text", ctypes.POINTER(ctypes.c_char)), ("length", c_size_t), ("ids", ctypes.POINTER(c_int32)),
                ("n_ids", c_size_t), ("thinking", ctypes.c_bool), ("starts_in_reasoning", ctypes.c_bool),
                ("has_tools", ctypes.c_bool), ("tool_choice", ctypes.c_int),
                ("forced", ctypes.POINTER(ctypes.c_char)), ("forced_length", c_size_t),
                ("insert_after", c_int32), ("insert_ids", ctypes.POINTER(c_int32)), ("n_insert_ids", c_size_t),
                ("call_names", ctypes.POINTER(ctypes.c_char_p)), ("n_call_names", c_size_t)]


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
                ("kv_cache_fraction", ctypes.c_float), ("max_context", c_int32), ("kv_block_size", c_int32),
                ("prefix_cache", ctypes.c_bool)]


class _EngineStats(ctypes.Structure):
    _fields_ = [("kv_block_size", c_int32), ("kv_blocks_total", c_int32), ("kv_blocks_free", c_int32),
                ("kv_capacity_tokens", c_size_t), ("max_concurrent_full", c_int32), ("max_context", c_int32),
                ("running", c_int32), ("waiting", c_int32), ("preemptions", c_int64), ("steps", c_int64),
                ("steps_ahead", c_int64), ("kv_blocks_cached", c_int32), ("prefix_cache", ctypes.c_bool),
                ("prefix_cache_queried_tokens", c_int64), ("prefix_cache_hit_tokens", c_int64),
                ("prefix_cache_evictions", c_int64)]


_BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
_WEIGHTS = {"bf16": 0, "fp8": 1}  # kite_weights: how the linear layers' weights are held
_KV_CACHE_DTYPES = {"bf16": 0, "fp8": 1}  # kite_kv_cache_dtype: how the KV cache holds keys and values
# Generation options and their defaults (greedy, up to 128 new tokens), shared by generate, generate_batch
# and stream; the names are OpenAI's / vLLM's. seed None draws a fresh seed per request.
_DEFAULT_OPTIONS = {"max_tokens": 128, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": None,
                    "stop": (), "ignore_eos": False, "min_tokens": 0, "logit_bias": None, "logprobs": 0}
_FINISH = {0: None, 1: "length", 2: "stop", 3: "cancelled", 4: "capacity", 5: "error"}
_FINISH_ERROR = 5  # KITE_FINISH_ERROR: the request's logits allowed no token; raised as KiteError
_MAX_LOGPROBS = 20  # KITE_MAX_LOGPROBS
_MAX_LOGIT_BIAS = 300  # KITE_MAX_LOGIT_BIAS


class KiteError(RuntimeError):
    """A kite call failed; the message is kite's (it names the file, tensor, field or argument)."""


# ---- arguments, checked before they reach ctypes (which wraps integers and cuts strings at NUL) --------------

_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1
_SIZE_MAX = 2**(8 * ctypes.sizeof(c_size_t)) - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _integer(name, value, low, high):
    """An int in [low, high]; a bool, a float or a string is refused (ctypes would take or wrap them)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KiteError(f"kite: {name} must be an integer, not {type(value).__name__} {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise KiteError(f"kite: {name} {value} is outside [{low}, {high}]")
    return value


def _real(name, value):
    """A finite number that a C float holds (a larger one would become inf); a bool is not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise KiteError(f"kite: {name} must be a number, not {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise KiteError(f"kite: {name} {value} is too large for a 32-bit float") from None
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        raise KiteError(f"kite: {name} {value!r} is not a finite 32-bit float")
    return value


def _flag(name, value):
    if not isinstance(value, bool):
        raise KiteError(f"kite: {name} must be True or False, not {type(value).__name__} {value!r}")
    return value


def _utf8(name, value):
    if not isinstance(value, str):
        raise KiteError(f"kite: {name} must be a str, not {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise KiteError(f"kite: {name} is not valid Unicode ({e.reason} at character {e.start})") from None


def _c_string(name, value):
    """A NUL-terminated string for the C API: a NUL inside would silently end it there."""
    data = _utf8(name, value)
    if b"\0" in data:
        raise KiteError(f"kite: {name} contains a NUL character")
    return data


def _token_ids(name, ids):
    """A list or tuple (or any ordered iterable) of token ids as an int32 array; text and bytes are refused
    (iterating them would give characters or byte values)."""
    if isinstance(ids, (str, bytes, bytearray, memoryview, abc.Set, abc.Mapping)) or not isinstance(ids, abc.Iterable):
        raise KiteError(f"kite: {name} must be a str or a sequence of token ids, not {type(ids).__name__}")
    values = [_integer(f"{name}[{i}]", v, 0, _INT32_MAX) for i, v in enumerate(ids)]
    return (c_int32 * len(values))(*values), len(values)


def _stop_strings(stop):
    """stop: None, a str (one stop string, as OpenAI's API takes it, not its characters) or a sequence of str."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    elif isinstance(stop, (bytes, bytearray, memoryview, abc.Set, abc.Mapping)) or not isinstance(stop, abc.Iterable):
        raise KiteError(f"kite: stop must be a str or a sequence of str, not {type(stop).__name__}")
    encoded = []
    for i, x in enumerate(stop):
        data = _c_string(f"stop[{i}]", x)
        if not data:
            raise KiteError(f"kite: stop[{i}] is empty")
        encoded.append(data)
    if len(encoded) > _INT32_MAX:
        raise KiteError(f"kite: {len(encoded)} stop strings, at most {_INT32_MAX}")
    return encoded


def _logit_bias(value):
    """OpenAI's logit_bias, {token id: bias} (ids as ints or their decimal strings, as in the JSON), as an array
    of kite_logit_bias; None when there is none. The library checks the ranges and the vocabulary."""
    if value is None:
        return None
    if not isinstance(value, abc.Mapping):
        raise KiteError(f"kite: logit_bias must be a mapping of token id to bias, not {type(value).__name__}")
    if len(value) > _MAX_LOGIT_BIAS:
        raise KiteError(f"kite: logit_bias has {len(value)} entries, at most {_MAX_LOGIT_BIAS}")
    entries = []
    for key, bias in value.items():
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        entries.append(_LogitBias(_integer("logit_bias token", key, -_INT32_MAX - 1, _INT32_MAX),
                                  _real(f"logit_bias[{key}]", bias)))
    if not entries:
        return None
    return (_LogitBias * len(entries))(*entries)


def _sampling_option(name, value):
    """top_k is an int32 count; temperature, top_p, min_p and the penalties are C floats."""
    return _integer(name, value, 0, _INT32_MAX) if name == "top_k" else _real(name, value)


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


def _check(status: int, lib=None):
    if status != 0:
        message = (lib or _lib).kite_last_error()
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

class _Run:
    """One submitted request as the binding follows it: what its events delivered so far."""

    def __init__(self):
        self.id = None
        self.completion = Completion()
        self.pieces = []     # text (or ChatDelta) not yet handed to the consumer
        self.done = False    # its last event arrived
        self.error = None    # an exception raised while reading one of its events
        self.failure = None  # KITE_FINISH_ERROR's message: the engine ended this request (its logits allowed no token)

    def raise_failure(self):
        if self.failure is not None:
            raise KiteError(f"kite: request {self.id}: {self.failure}")


class Model:
    """A loaded Qwen3 checkpoint and the engine that generates with it (created on first use).

    Lifetimes: stream() and chat(stream=True) generators keep their Model alive; after close() they raise
    KiteError("the model is closed") when resumed and end quietly when closed or collected.
    Threads: a Model may be shared by threads. The C engine is single-threaded, so every call into the library
    holds the Model's lock; a stream holds it only while it steps the engine, so streams and generate calls
    from several threads interleave, each getting the tokens it would get alone (batch-invariant).
    weights: "bf16" (as stored; an FP8 checkpoint dequantized) or "fp8" (E4M3 with 128x128 block scales,
    quantized at load from a bf16 checkpoint); docs/FP8.md.
    kv_cache_dtype: "bf16" (the CPU backend: float32) or "fp8" (E4M3 codes with one scale per token and KV head,
    about half the bytes of a bf16 cache); docs/ARCHITECTURE.md.
    prefix_cache: automatic prefix caching (default True): requests that begin with the same tokens share the
    full KV blocks already computed; the tokens are the same either way (docs/ARCHITECTURE.md).
    weight_cache: the folder of converted weights kept between loads (docs/weight-cache.md): None for the
    default ($XDG_CACHE_HOME/kite, else ~/.cache/kite), "off" for none."""

    def __init__(self, path: Optional[str] = None, *, backend: str = "auto", threads: int = 0, device: int = 0,
                 weights: str = "bf16", kv_cache_dtype: str = "bf16", dummy: Optional[str] = None, seed: int = 0, library: Optional[str] = None,
                 kv_cache_mb: Optional[int] = None, max_context: int = 0, max_sequences: int = 0,
                 rope_scaling=None, prefix_cache: bool = True, weight_cache: Optional[str] = None):
        # Set first: close() and __del__ see a half-made Model when a check below raises.
        self._lock = threading.RLock()
        self._handle, self._engine = None, None
        self._runs = {}        # request id -> _Run, while the engine may still send it events
        self._deferred = []    # request ids to cancel once the library call in progress returns
        self._in_library = 0   # nesting of library calls that may call back into Python (on this lock's owner)
        lib = load_library(library)
        if not isinstance(backend, str) or backend not in _BACKENDS:
            raise KiteError(f"kite: backend {backend!r} is not one of {', '.join(_BACKENDS)}")
        if not isinstance(weights, str) or weights not in _WEIGHTS:
            raise KiteError(f"kite: weights {weights!r} is not one of {', '.join(_WEIGHTS)}")
        if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise KiteError(f"kite: kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(_KV_CACHE_DTYPES)}")
        if (path is None) == (dummy is None):
            raise KiteError("kite: give a checkpoint directory or dummy=SHAPE, not both and not neither")
        params = lib.kite_load_params_default()
        params.backend = _BACKENDS[backend]
        params.n_threads = _integer("threads", threads, 0, _INT32_MAX)
        params.device = _integer("device", device, 0, _INT32_MAX)
        params.weights = _WEIGHTS[weights]
        params.kv_cache_dtype = _KV_CACHE_DTYPES[kv_cache_dtype]
        engine_params = lib.kite_engine_params_default()
        # 0 (or no kv_cache_mb) keeps the engine's default
        kv_cache_mb = 0 if kv_cache_mb is None else _integer("kv_cache_mb", kv_cache_mb, 0, _SIZE_MAX >> 20)
        if kv_cache_mb:
            engine_params.kv_cache_bytes = kv_cache_mb << 20
        # max_context lowers the model's context limit (kite_load_params.max_context); rope_scaling (a dict, or
        # its JSON text) replaces config.json's rope scaling, e.g. {"rope_type": "yarn", "factor": 4.0,
        # "original_max_position_embeddings": 32768}
        params.max_context = _integer("max_context", max_context, 0, _INT32_MAX)
        rope_scaling_text = None
        if rope_scaling is not None:
            if isinstance(rope_scaling, dict):
                rope_scaling = json.dumps(rope_scaling)
            if not isinstance(rope_scaling, str):
                raise KiteError(f"kite: rope_scaling must be a dict or JSON text, not {type(rope_scaling).__name__}")
            rope_scaling_text = _c_string("rope_scaling", rope_scaling)
        params.rope_scaling = rope_scaling_text
        weight_cache_text = None
        if weight_cache is not None:
            if not isinstance(weight_cache, str) or not weight_cache:
                raise KiteError(f"kite: weight_cache must be a folder or \"off\", not {weight_cache!r}")
            weight_cache_text = _c_string("weight_cache", weight_cache)
        params.weight_cache = weight_cache_text
        max_sequences = _integer("max_sequences", max_sequences, 0, _INT32_MAX)
        if max_sequences:
            engine_params.max_sequences = max_sequences
        # automatic prefix caching (kite_engine_params.prefix_cache): the same tokens either way
        if not isinstance(prefix_cache, bool):
            raise KiteError(f"kite: prefix_cache must be True or False, not {prefix_cache!r}")
        engine_params.prefix_cache = prefix_cache
        handle = ctypes.c_void_p()
        if dummy is not None:
            shape = _c_string("dummy", dummy)
            _check(lib.kite_model_load_dummy(shape, _integer("seed", seed, 0, _UINT64_MAX), ctypes.byref(params),
                                             ctypes.byref(handle)), lib)
        else:
            try:
                encoded_path = os.fsencode(path)
            except TypeError:
                raise KiteError(f"kite: the checkpoint path must be a str or os.PathLike, not {type(path).__name__}") from None
            if b"\0" in encoded_path:
                raise KiteError("kite: the checkpoint path contains a NUL character")
            _check(lib.kite_model_load(encoded_path, ctypes.byref(params), ctypes.byref(handle)), lib)
        self._lib, self._handle, self._engine_params = lib, handle, engine_params
        # The engine calls back through these two for every request; they live as long as the Model, so a
        # request whose consumer is gone never calls freed code. _runs is captured, not self (no cycle).
        self._on_token = _TokenCallback(self._token_dispatcher(self._runs))
        self._on_chat = _ChatCallback(self._chat_dispatcher(self._runs))
        info = lib.kite_model_get_info(handle)
        self.info = {
            "vocab_size": info.vocab_size, "n_layers": info.n_layers, "hidden_size": info.hidden_size,
            "max_context": info.max_context, "eos_ids": [info.eos_ids[i] for i in range(info.n_eos_ids)],
            "has_tokenizer": bool(info.has_tokenizer), "backend": info.backend_name.decode(),
            "n_parameters": info.n_parameters,
        }

    # lifetime
    def close(self):
        """Frees the engine and the model. Streams still open raise KiteError when resumed. Waits for a call
        in progress on another thread to return."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._in_library:  # only a finalizer run inside a callback could get here
                raise KiteError("kite: close() inside a call into the library")
            engine, self._engine = self._engine, None
            handle, self._handle = self._handle, None
            self._runs.clear()
            self._deferred.clear()
            if engine:
                self._lib.kite_engine_free(engine)  # before the model: the engine uses its backend
            if handle:
                self._lib.kite_model_free(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Nothing else references this Model, so the lock is free; a thread frozen at interpreter exit while it
        # held the lock is the exception, and then the memory is left to the process's end.
        lock = getattr(self, "_lock", None)
        if lock is None or not lock.acquire(blocking=False):
            return
        try:
            self.close()
        finally:
            lock.release()

    # every call that takes the model or the engine runs with the lock held and goes through these
    def _model(self):
        if not self._handle:
            raise KiteError("kite: the model is closed")
        return self._handle

    def _engine_handle(self):
        self._model()
        if self._engine is None:
            handle = ctypes.c_void_p()
            _check(self._lib.kite_engine_create(self._handle, ctypes.byref(self._engine_params), ctypes.byref(handle)),
                   self._lib)
            self._engine = handle
        return self._engine

    def _call(self, function, *arguments):
        """A library call that may call back into Python (submit, step, run, cancel). A stream collected by the
        garbage collector during such a call (inside a callback) cannot re-enter the engine: its cancel waits
        here until the call returns."""
        self._in_library += 1
        try:
            status = function(*arguments)
            message = self._lib.kite_last_error() if status != 0 else None  # before a deferred cancel resets it
        finally:
            self._in_library -= 1
        if self._in_library == 0:
            while self._deferred and self._engine:
                request_id = self._deferred.pop()
                self._in_library += 1
                try:
                    self._lib.kite_engine_cancel(self._engine, request_id)  # fails only for a request already gone
                finally:
                    self._in_library -= 1
        if status != 0:
            raise KiteError(message.decode("utf-8", "replace") if message else f"kite: status {status}")
        return status

    def _step(self, run: _Run):
        """One engine step for `run` (the lock held); the engine going idle before the run ends is an error."""
        engine = self._engine_handle()
        if self._lib.kite_engine_idle(engine):
            raise KiteError(f"kite: the engine is idle but request {run.id} has not finished")
        self._call(self._lib.kite_engine_step, engine)

    def _settle(self):
        """With no request of this Model left, runs the engine dry (a decode step run ahead is resolved and
        finished requests dropped), so its stats show it empty."""
        if not self._runs and self._engine:
            self._call(self._lib.kite_engine_run, self._engine)

    def _abandon(self, run: _Run):
        """A consumer stopped before its request ended: the request is cancelled (at once, or when the library
        call in progress returns). Nothing to do once the model is closed: its engine and requests are gone."""
        with self._lock:
            if self._handle is None or run.id is None or run.done:
                return
            self._runs.pop(run.id, None)
            if self._in_library:
                self._deferred.append(run.id)
                return
            self._call(self._lib.kite_engine_cancel, self._engine, run.id)
            self._settle()

    # tokenizer
    def tokenize(self, text: str) -> List[int]:
        data = _utf8("text", text)
        ids, n = ctypes.POINTER(c_int32)(), c_size_t()
        with self._lock:
            _check(self._lib.kite_tokenize(self._model(), data, len(data), ctypes.byref(ids), ctypes.byref(n)),
                   self._lib)
        try:
            return ids[: n.value]
        finally:
            self._lib.kite_free(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        array, n_ids = _token_ids("ids", ids)
        text, n = ctypes.c_void_p(), c_size_t()
        with self._lock:
            _check(self._lib.kite_detokenize(self._model(), array, n_ids, ctypes.byref(text), ctypes.byref(n)),
                   self._lib)
        try:
            return ctypes.string_at(text, n.value).decode("utf-8") if n.value else ""
        finally:
            self._lib.kite_free(text)

    # generation
    def engine_stats(self) -> dict:
        with self._lock:
            stats = self._lib.kite_engine_get_stats(self._engine_handle())
        return {name: getattr(stats, name) for name, _ in _EngineStats._fields_}

    def _request(self, prompt: Union[str, Sequence[int]], options: dict):
        """The kite_request for a prompt and generation options, every value checked; with what it points at."""
        unknown = set(options) - set(_DEFAULT_OPTIONS)
        if unknown:
            raise KiteError("kite: unknown generation option(s) " + ", ".join(sorted(unknown)))
        o = {**_DEFAULT_OPTIONS, **options}
        request = self._lib.kite_request_default()
        keep = []  # everything the request points at stays alive until the submit has copied it
        if isinstance(prompt, str):
            data = _utf8("prompt", prompt)
            request.prompt_text, request.prompt_text_length = data, len(data)
            keep.append(data)
        else:
            ids, n = _token_ids("prompt", prompt)
            request.prompt_ids, request.n_prompt_ids = ids, n
            keep.append(ids)
        s = request.sampling
        for name in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            setattr(s, name, _sampling_option(name, o[name]))
        if o["seed"] is None:
            s.seed, s.fresh_seed = 0, True
        else:
            s.seed = _integer("seed", o["seed"], 0, _UINT64_MAX)
        request.max_tokens = _integer("max_tokens", o["max_tokens"], 0, _INT32_MAX)
        request.ignore_eos = _flag("ignore_eos", o["ignore_eos"])
        request.min_tokens = _integer("min_tokens", o["min_tokens"], 0, _INT32_MAX)
        request.n_logprobs = _integer("logprobs", o["logprobs"], 0, _MAX_LOGPROBS)
        bias = _logit_bias(o["logit_bias"])
        if bias is not None:
            request.logit_bias, request.n_logit_bias = bias, len(bias)
            keep.append(bias)
        encoded = _stop_strings(o["stop"])
        if encoded:
            strings = (ctypes.c_char_p * len(encoded))(*encoded)
            request.stop_strings, request.n_stop_strings = strings, len(encoded)
            keep.extend([encoded, strings])
        request.on_token = self._on_token
        return request, keep

    def _submit(self, prepared) -> _Run:
        """Queues a prepared request (the lock held); its events go to the returned _Run."""
        request, _keep = prepared
        run, request_id = _Run(), c_int64()
        self._runs[None] = run  # an event during the submit itself (a prompt that can never fit) finds it
        try:
            self._call(self._lib.kite_engine_submit, self._engine_handle(), ctypes.byref(request),
                       ctypes.byref(request_id))
        finally:
            self._runs.pop(None, None)
        run.id = request_id.value
        if not run.done:
            self._runs[run.id] = run
        return run

    @staticmethod
    def _token_dispatcher(runs: dict):
        """The engine's callback: each event goes to its request's _Run (none: the consumer is gone)."""
        def on_event(event_pointer, _user_data):
            e = event_pointer.contents
            run = runs.get(e.request) or runs.get(None)
            if run is None:
                return
            try:
                completion = run.completion
                piece = ctypes.string_at(e.text, e.text_length).decode("utf-8") if e.text_length else ""
                if piece:
                    completion.text += piece
                    run.pieces.append(piece)
                if e.token >= 0:
                    completion.tokens.append(e.token)
                    if e.n_top > 0:
                        top = [(e.top_ids[i], e.top_logprobs[i]) for i in range(e.n_top)]
                        completion.logprobs.append(TokenLogprob(e.token, e.logprob, top))
            except Exception as error:  # raised to the consumer, not lost in ctypes' "exception ignored"
                run.error = run.error or error
            if e.finish:
                run.completion.finish_reason = _FINISH.get(e.finish, str(e.finish))
                if e.finish == _FINISH_ERROR:
                    run.failure = (e.error or b"no token can be chosen").decode("utf-8", "replace")
                run.done = True
                runs.pop(e.request, None)
        return on_event

    @staticmethod
    def _chat_dispatcher(runs: dict):
        def on_event(event_pointer, _user_data):
            e = event_pointer.contents
            run = runs.get(e.request) or runs.get(None)
            if run is None:
                return
            try:
                d = e.delta
                calls = [ToolCall(d.tool_calls[i].id.decode(), d.tool_calls[i].name.decode("utf-8"),
                                  d.tool_calls[i].arguments.decode("utf-8")) for i in range(d.n_tool_calls)]
                run.pieces.append(ChatDelta(
                    content=ctypes.string_at(d.content, d.content_length).decode("utf-8") if d.content_length else "",
                    reasoning=(ctypes.string_at(d.reasoning, d.reasoning_length).decode("utf-8")
                               if d.reasoning_length else ""),
                    tool_calls=calls, finish_reason=_FINISH.get(e.finish, str(e.finish)) if e.finish else None))
            except Exception as error:
                run.error = run.error or error
            if e.finish:
                if e.finish == _FINISH_ERROR:
                    error = e.token.contents.error if e.token else None
                    run.failure = (error or b"no token can be chosen").decode("utf-8", "replace")
                run.done = True
                runs.pop(e.request, None)
        return on_event

    def _cancel_unfinished(self, runs):
        for run in runs:
            if run.id is not None and not run.done and self._handle is not None:
                self._runs.pop(run.id, None)
                self._call(self._lib.kite_engine_cancel, self._engine, run.id)

    def generate_batch(self, prompts: Sequence[Union[str, Sequence[int]]], **options) -> List[Completion]:
        """Runs every prompt as one continuous batch; returns their completions in order. Options (defaults
        in _DEFAULT_OPTIONS): max_tokens, temperature (0 = greedy), top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty (OpenAI's, over the generated tokens), seed (None: a fresh one), stop (a
        string or strings), ignore_eos, min_tokens, logit_bias ({token id: bias in [-100, 100]}), logprobs (top-K
        per token, at most 20; raw logprobs, before bias and penalties, as vLLM's default). A request whose logits
        allow no token (a NaN or +inf: the weights are not finite) ends alone, the others run to their end, and the
        call then raises KiteError with the engine's message."""
        if isinstance(prompts, (str, bytes, bytearray)) or not isinstance(prompts, abc.Iterable):
            raise KiteError(f"kite: prompts must be a sequence of prompts, not {type(prompts).__name__}")
        prepared = [self._request(p, options) for p in prompts]
        with self._lock:
            runs = []
            try:
                for request in prepared:
                    runs.append(self._submit(request))
                for run in runs:
                    while not run.done:
                        self._step(run)
            finally:  # an error (or an interrupt) leaves none of these requests in the engine
                self._cancel_unfinished(runs)
            self._settle()
        for run in runs:
            if run.error:
                raise KiteError(f"kite: reading the events of request {run.id}: {run.error}") from run.error
        for run in runs:  # the other requests ran to their end: only this one's logits allowed no token
            run.raise_failure()
        return [run.completion for run in runs]

    def generate(self, prompt: Union[str, Sequence[int]], **options) -> Completion:
        """One prompt (text or token ids) to its completion; options as generate_batch."""
        return self.generate_batch([prompt], **options)[0]

    def stream(self, prompt: Union[str, Sequence[int]], **options) -> Iterator[str]:
        """Yields the completion's text as it is produced (the pieces concatenate to generate()'s text).
        The options are checked now; the request is submitted when the first piece is asked for."""
        return self._stream_pieces(self._request(prompt, options), None)

    def _stream_pieces(self, prepared, render):
        """Submits (render() gives the prepared request, for chat, at the first step) and yields the run's
        pieces, holding the lock only while it submits and steps."""
        run = None
        try:
            while True:
                with self._lock:
                    if run is None:
                        self._model()
                        run = self._submit(prepared) if render is None else render()
                    elif self._handle is None:
                        raise KiteError("kite: the model is closed")
                    elif not run.pieces and not run.done:
                        self._step(run)
                    pieces, run.pieces = run.pieces, []
                    if run.error:
                        raise KiteError(f"kite: reading the events of request {run.id}: {run.error}") from run.error
                    done = run.done
                    if done:
                        self._settle()
                yield from pieces
                if done:
                    run.raise_failure()  # after the text made before the row that allowed no token
                    return
        finally:  # a consumer that stops early cancels the request, so the engine is left idle
            if run is not None and not run.done:
                self._abandon(run)

    # chat
    def _chat_handle(self):
        chat = self._lib.kite_model_chat(self._model())
        if not chat:
            raise KiteError("kite: this checkpoint has no chat template")
        return chat

    @staticmethod
    def _chat_body(messages, tools, enable_thinking, add_generation_prompt, template_kwargs) -> bytes:
        _flag("enable_thinking", enable_thinking)
        _flag("add_generation_prompt", add_generation_prompt)
        if isinstance(messages, (str, bytes, abc.Mapping)) or not isinstance(messages, abc.Iterable):
            raise KiteError(f"kite: messages must be a sequence of message objects, not {type(messages).__name__}")
        if template_kwargs is not None and not isinstance(template_kwargs, abc.Mapping):
            raise KiteError(f"kite: template_kwargs must be a dict, not {type(template_kwargs).__name__}")
        body = {"messages": list(messages), "add_generation_prompt": add_generation_prompt,
                "chat_template_kwargs": {**(template_kwargs or {}), "enable_thinking": enable_thinking}}
        if tools:
            body["tools"] = list(tools)
        try:
            return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as e:
            raise KiteError(f"kite: the chat request is not JSON: {e}") from None

    def render_chat(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None, *,
                    enable_thinking: bool = True, add_generation_prompt: bool = True,
                    template_kwargs: Optional[dict] = None) -> str:
        """The prompt the checkpoint's chat template renders for OpenAI-style messages (and tools)."""
        prompt = _ChatPrompt()
        data = self._chat_body(messages, tools, enable_thinking, add_generation_prompt, template_kwargs)
        with self._lock:
            _check(self._lib.kite_chat_render(self._chat_handle(), data, len(data), ctypes.byref(prompt)), self._lib)
        try:
            return ctypes.string_at(prompt.text, prompt.length).decode("utf-8")
        finally:
            self._lib.kite_chat_prompt_free(ctypes.byref(prompt))

    _SAMPLING_NAMES = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                       "frequency_penalty")
    _CHAT_OPTIONS = set(_SAMPLING_NAMES) | {"max_tokens", "seed", "stop"}

    def _chat_events(self, messages, tools, enable_thinking, template_kwargs, options):
        """Checks the options now; returns (a generator of ChatDelta, a list that receives the prompt text when
        the answer is submitted, at the first step)."""
        unknown = set(options) - self._CHAT_OPTIONS
        if unknown:
            raise KiteError("kite: unknown chat option(s) " + ", ".join(sorted(unknown)))
        data = self._chat_body(messages, tools, enable_thinking, True, template_kwargs)
        sampling = {name: _sampling_option(name, options[name])
                    for name in self._SAMPLING_NAMES if options.get(name) is not None}
        seed = options.get("seed")
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else _integer("seed", seed, 0, _UINT64_MAX)
        max_tokens = options.get("max_tokens")
        max_tokens = 0 if max_tokens is None else _integer("max_tokens", max_tokens, 0, _INT32_MAX)
        encoded = _stop_strings(options.get("stop"))
        strings = (ctypes.c_char_p * len(encoded))(*encoded) if encoded else None
        rendered = []

        def submit():  # with the lock held
            chat = self._chat_handle()
            prompt = _ChatPrompt()
            _check(self._lib.kite_chat_render(chat, data, len(data), ctypes.byref(prompt)), self._lib)
            try:
                rendered.append(ctypes.string_at(prompt.text, prompt.length).decode("utf-8"))
                request = self._lib.kite_request_default()
                # Sampling the request leaves unset follows generation_config.json; no seed draws a fresh one.
                request.sampling = self._lib.kite_chat_sampling_defaults(chat)
                for name, value in sampling.items():
                    setattr(request.sampling, name, value)
                request.sampling.seed = seed
                request.max_tokens = max_tokens
                if encoded:
                    request.stop_strings, request.n_stop_strings = strings, len(encoded)
                run, request_id = _Run(), c_int64()
                self._runs[None] = run
                try:
                    self._call(self._lib.kite_chat_submit, self._engine_handle(), chat, ctypes.byref(prompt),
                               ctypes.byref(request), self._on_chat, None, ctypes.byref(request_id))
                finally:
                    self._runs.pop(None, None)
                run.id = request_id.value
                if not run.done:
                    self._runs[run.id] = run
                return run
            finally:
                self._lib.kite_chat_prompt_free(ctypes.byref(prompt))

        return self._stream_pieces(None, submit), rendered

    def chat(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None, *, enable_thinking: bool = True,
             stream: bool = False, template_kwargs: Optional[dict] = None, **options):
        """Answers OpenAI-style messages through the checkpoint's chat template. Returns a ChatCompletion
        (content, reasoning, tool_calls), or with stream=True yields ChatDelta pieces as they are generated.
        Options: max_tokens (default: until the turn ends), temperature, top_k, top_p, min_p,
        repetition_penalty, presence_penalty, frequency_penalty (unset ones follow generation_config.json), seed
        (default: a fresh one), stop (a string or strings)."""
        _flag("stream", stream)
        events, rendered = self._chat_events(messages, tools, enable_thinking, template_kwargs, options)
        if stream:
            return events
        result = ChatCompletion()
        for delta in events:
            result.content += delta.content
            result.reasoning += delta.reasoning
            result.tool_calls.extend(delta.tool_calls)
            if delta.finish_reason:
                result.finish_reason = delta.finish_reason
        result.prompt = rendered[0] if rendered else ""
        return result
