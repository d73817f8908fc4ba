"""A Llama decoder whose attention reads keys and values through block tables.

RMSNorm, rotate-half RoPE, SwiGLU MLP, grouped-query attention, tied embeddings where the
checkpoint ties them; parameter names are Hugging Face's, so a state dict loads as it is.
Every layer first writes the step's new K/V into the paged cache, then gathers each sequence's
context from it: so a sequence may attend to blocks another sequence of the same step wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lanefold.backends.engine._arith import compute_dtype, linear, pack, sdpa_dtype
from lanefold.backends.engine._attention import (
    AttentionBatch,
    Lane,
    causal_attention,
    lane_attention,
    paged_attention,
)
from lanefold.backends.engine._decode_paths import DecodePaths, Shape, choose_paths, for_threads
from lanefold.backends.engine._lane_step import Stack, lane_layers, lane_put, stack
from lanefold.backends.engine._layers import layer_in, layer_out, staged_in, staged_out
from lanefold.backends.engine._memory import Arena
from lanefold.backends.engine._products import ROWS as _KERNEL_ROWS
from lanefold.backends.engine._products import small_linear
from lanefold.backends.engine._tiled_step import TileStack, tile_stack, tiled_lane_layers, tiled_layers
from lanefold.backends.engine._tiles import Tiles, tile, tile_shape
from lanefold.backends.engine._weights import Checkpoint, ModelArgs

__all__ = ("AttentionBatch", "CausalLM", "KVCache", "build_model", "rope_inv_freq")

_HEAD_SLICE = 2048  # rows of the LM head a CPU matrix product takes at once


@dataclass(slots=True)
class KVCache:
    """Keys and values of every layer, one row per token slot.

    Shape `[layers, blocks * block_size, kv_heads, head_dim]`; slot = block * block_size + offset.
    """

    k: Tensor
    v: Tensor

    @classmethod
    def empty(cls, args: ModelArgs, slots: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        """Zeroed storage for `slots` tokens of every layer.

        Zeroed, not empty: padded and masked slots still enter attention with weight 0, and
        0 * NaN from uninitialised memory would poison the output.
        """
        shape = (args.num_layers, slots, args.num_kv_heads, args.head_dim)
        return cls(_zeros(shape, dtype, device), _zeros(shape, dtype, device))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeros; on CPU from calloc (numpy), whose pages the OS zeroes when first touched, so a
    pool of hundreds of MiB costs nothing until it is used (torch.zeros writes it all: 0.4 s
    of CPU for the default 512 MiB, a third of a warm load)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    width = torch.empty((), dtype=dtype).element_size()
    raw = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    return torch.from_numpy(np.zeros(shape, dtype=raw)).view(dtype)


class _Linear(nn.Linear):
    """`nn.Linear` whose weights always come from a checkpoint: never randomly initialised.

    Random init of a meta tensor imports `torch._dynamo` (2 s of CPU, most of a warm load).
    """

    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    """`nn.Embedding` whose weights always come from a checkpoint: never randomly initialised."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Root-mean-square norm's weight (the arithmetic is `_rms_norm`, eps from `ModelArgs`)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class Attention(nn.Module):
    """Grouped-query self-attention's projections (the arithmetic is `_decoder_layer`)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        heads, kv_heads, dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_proj = _Linear(args.hidden_size, heads * dim, bias=False)
        self.k_proj = _Linear(args.hidden_size, kv_heads * dim, bias=False)
        self.v_proj = _Linear(args.hidden_size, kv_heads * dim, bias=False)
        self.o_proj = _Linear(heads * dim, args.hidden_size, bias=False)


class MLP(nn.Module):
    """SwiGLU feed-forward's projections."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = _Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = _Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = _Linear(args.intermediate_size, args.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    """Pre-norm attention then pre-norm MLP, each with a residual."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size)
        self.mlp = MLP(args)
        # (q|k|v, gate|up) as two matrices, the projections' weights views of their rows:
        # set by `build_model`; neither parameters nor buffers, so `.to()` leaves them behind
        # and `LayerWeights.of` then ignores them
        self.fused: tuple[Tensor, Tensor] | None = None
        # (the dense matrices and their version counters, their packed copies) where
        # `build_model` made them: (qkv, o, gate_up, down) each, see `_arith.packs`
        self.packed: tuple[tuple[Tensor, ...], tuple[int, ...], tuple[Tensor | Tiles, ...]] | None = None


class Decoder(nn.Module):
    """Embeddings, the layer stack and the final norm (HF's `model.` prefix)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = _Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, as `_decoder_layer` reads them.

    `qkv` `[q + k + v outputs, hidden]` and `gate_up` `[2 * intermediate, hidden]`, where set,
    hold the group's weights one after another (see `_rows_of`): each group is one product
    for the one or two rows `_layers` takes. `packed`, where set, is (qkv, o, gate_up, down)
    in oneDNN's layout, for three rows and more (see `_arith.packs`).
    """

    input_norm: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    post_norm: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    qkv: Tensor | None = None
    gate_up: Tensor | None = None
    packed: tuple[Tensor | Tiles, ...] | None = None
    versions: tuple[int, ...] = ()  # the dense matrices' version counters `packed` was made at
    norms32: tuple[Tensor, Tensor] = (torch.empty(0), torch.empty(0))  # the norms in fp32

    @classmethod
    def of(cls, layer: DecoderLayer) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = gate_up = None
        packed = None
        versions: tuple[int, ...] = ()
        if layer.fused is not None and _views_of(
            layer.fused, (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
        ):
            qkv, gate_up = layer.fused
            if layer.packed is not None:  # made of these very tensors, none written since
                sources, versions, copies = layer.packed
                now = (qkv, attn.o_proj.weight, gate_up, mlp.down_proj.weight)
                if all(a is b for a, b in zip(sources, now, strict=True)) and versions == tuple(
                    t._version for t in now
                ):
                    packed = copies
                else:
                    layer.packed = None  # stale for good: drop the copies' memory
        return cls(
            layer.input_layernorm.weight,
            attn.q_proj.weight,
            attn.k_proj.weight,
            attn.v_proj.weight,
            attn.o_proj.weight,
            layer.post_attention_layernorm.weight,
            mlp.gate_proj.weight,
            mlp.up_proj.weight,
            mlp.down_proj.weight,
            qkv,
            gate_up,
            packed,
            versions if packed is not None else (),
            (_fp32(layer.input_layernorm.weight), _fp32(layer.post_attention_layernorm.weight)),
        )


def _fp32(norm: Tensor) -> Tensor:
    """A norm's weight as the compiled layer loops read it (the weight itself where fp32)."""
    return norm.detach().float().contiguous()


def _rewritten(weights: LayerWeights) -> bool:
    """Whether a matrix with a packed copy was written in place since (the copy is stale)."""
    if weights.packed is None:
        return False
    dense = (weights.qkv, weights.o, weights.gate_up, weights.down)
    return any(t is not None and t._version != v for t, v in zip(dense, weights.versions, strict=True))


def _views_of(fused: tuple[Tensor, Tensor], *groups: tuple[nn.Linear, ...]) -> bool:
    """Whether each group's weights still live in its fused matrix (no `.to()` or assigning
    load replaced them since)."""
    return all(
        m.weight.untyped_storage().data_ptr() == matrix.untyped_storage().data_ptr()
        for matrix, group in zip(fused, groups, strict=True)
        for m in group
    )


class CausalLM(nn.Module):
    """The decoder plus its LM head; `forward` returns the hidden states of the new tokens.

    The modules hold the parameters under Hugging Face's names (so a state dict loads as it
    is); a step runs as plain functions over their tensors: calling the ~360 modules of a
    SmolLM2 step took about 5 ms of an 85 ms CPU decode step (cProfile) in Python alone.
    """

    inv_freq: Tensor

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        self.lm_head = _Linear(args.hidden_size, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)
        self._weights: list[LayerWeights] | None = None
        self._stack: tuple[list[LayerWeights], Stack | None] | None = None  # for `lane_layers`
        self.arena: Arena | None = None  # the block a CPU model's weights lie in (`build_model`)
        self.tiles_arena: Arena | None = None  # the block its copies lie in, where they are tiles
        self._tiles: tuple[list[LayerWeights], TileStack | None] | None = None  # for `tiled_layers`
        # (the head, its version counter then, a packed copy of it) where `build_model` made one
        self.head_packed: tuple[Tensor, int, Tensor | Tiles] | None = None
        self.paths: DecodePaths | None = None  # the way its steps go: chosen by `build_model`

    def decode_paths(self) -> DecodePaths:
        """The way this model's steps go now (`_decode_paths`): chosen by `build_model`, and
        chosen again for the products where torch's threads changed since (`ThreadTuner`)."""
        weight = self.lm_head.weight
        paths = self.paths
        if paths is None:  # a model `build_model` did not make
            paths = self.paths = choose_paths(Shape.of(self.args), weight.dtype, weight.device)
        elif paths.device == "cpu" and paths.threads != torch.get_num_threads():
            threads = torch.get_num_threads()
            paths = self.paths = for_threads(paths, Shape.of(self.args), weight.dtype, threads)
        return paths

    def layer_weights(self) -> list[LayerWeights]:
        """Every layer's tensors, read once (and again once `.to()` or a load replaced them)."""
        first = cast(DecoderLayer, self.model.layers[0])
        if (
            self._weights is None
            or self._weights[0].q is not first.self_attn.q_proj.weight
            or any(_rewritten(w) for w in self._weights)
        ):
            self._weights = [LayerWeights.of(cast(DecoderLayer, m)) for m in self.model.layers]
        return self._weights

    def _layer_stack(self) -> Stack | None:
        """The layers as `_lane_step.lane_layers` reads them, made once (and again once the
        layers' tensors are read afresh); None where the loops do not take them."""
        weights = self.layer_weights()
        if self._stack is None or self._stack[0] is not weights:
            layers = [(w.norms32[0], w.norms32[1], w.qkv, w.o, w.gate_up, w.down) for w in weights]
            whole = all(w.qkv is not None and w.gate_up is not None for w in weights)
            block = self.arena.words() if self.arena is not None else None
            made = None
            if whole and block is not None:
                made = stack(cast(list[tuple[Tensor, ...]], layers), block[0], block[1])
            self._stack = (weights, made)
        return self._stack[1]

    def _tile_stack(self) -> TileStack | None:
        """The layers as `_tiled_step.tiled_layers` reads them, made once (and again once the
        layers' tensors are read afresh); None where their copies are not all tiles."""
        weights = self.layer_weights()
        if self._tiles is None or self._tiles[0] is not weights:
            block = self.tiles_arena.words() if self.tiles_arena is not None else None
            made = None
            if block is not None and all(w.packed is not None for w in weights):
                layers = [(w.input_norm, w.post_norm, *cast(tuple[Tiles, ...], w.packed)) for w in weights]
                made = tile_stack(layers, block[0], block[1])
            self._tiles = (weights, made)
        return self._tiles[1]

    def _lane_step(
        self, x: Tensor, rope: Tensor, cache: KVCache, lane: Lane, paths: DecodePaths
    ) -> Tensor | None:
        """A lone lane's hidden state after every layer in one compiled call, in `x`'s dtype,
        as `paths.lone_lane` says: over AMX's tiles where the copies are tiles
        (`tiled_lane_layers`), through the loops (`lane_layers`) where they read faster than
        torch's products; None where neither applies (the layers go one by one)."""
        a = self.args
        rotated = (a.num_heads + a.num_kv_heads) * a.head_dim
        kv = ((cache.k, cache.v), lane.slot, (lane.keys, lane.values), lane.length)
        made = None
        if paths.lone_lane == "tiles" and (tiles := self._tile_stack()) is not None:
            made = tiled_lane_layers(x, tiles, a.rms_norm_eps, rope, rotated, *kv)
        if made is None and not paths.by_torch and (layers := self._layer_stack()) is not None:
            made = lane_layers(x, layers, a.rms_norm_eps, rope, rotated, *kv)
        return None if made is None else made.to(x.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, cache: KVCache, batch: AttentionBatch) -> Tensor:
        a = self.args
        x = F.embedding(input_ids, self.model.embed_tokens.weight)
        freqs = batch.positions.float()[:, None] * self.inv_freq[None, :]
        rope = torch.polar(torch.ones_like(freqs), freqs)[:, None, :]  # [N, 1, head_dim / 2]
        shape = (a.num_heads, a.num_kv_heads, a.head_dim)
        paths = self.decode_paths()
        if batch.lane is not None and x.device.type == "cpu":
            stepped = self._lane_step(x, rope[:, 0], cache, batch.lane, paths)
            if stepped is not None:
                return _rms_norm(stepped, self.model.norm.weight, a.rms_norm_eps)
        forks = batch.prefixes[0] if len(batch.prefixes) == 1 and batch.prefixes[0].rows is None else None
        if (
            forks is not None
            and forks.tiles is not None
            and forks.keys is not None
            and x.device.type == "cpu"
            and paths.forks == "tiles"
        ):
            tiles = self._tile_stack()  # K forks of one prompt, every product through AMX's tiles
            made = None
            if tiles is not None:
                rotated = (a.num_heads + a.num_kv_heads) * a.head_dim
                made = tiled_layers(
                    x, tiles, a.rms_norm_eps, rope[:, 0], rotated, (cache.k, cache.v), batch.write_slots,
                    forks.tiles, forks.keys.shape[2], batch.block_tables, batch.block_size, batch.positions,
                )  # fmt: skip
            if made is not None:
                return _rms_norm(made, self.model.norm.weight, a.rms_norm_eps)
        for i, weights in enumerate(self.layer_weights()):
            x = _decoder_layer(
                weights, x, rope, (cache.k[i], cache.v[i]), batch, i, shape, a.rms_norm_eps, paths.by_torch
            )
        return _rms_norm(x, self.model.norm.weight, a.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """fp32 logits of the given hidden states (several rows of a dtype this CPU emulates
        go in fp32 throughout, see `_arith`).

        One or two rows on a CPU go through `_products` (SmolLM2's 49152-row head at one row:
        about 2 ms in bf16, 4 in fp32). More rows go in slices of rows: MKL multiplies a few
        hidden states by a 49152-row head about 1.2x (8 rows) to 1.5x (16 rows) faster a
        slice at a time.
        """
        weight = self.lm_head.weight
        copy = None
        if self.head_packed is not None:
            head, version, packed = self.head_packed
            if head is weight and weight._version == version:  # neither replaced nor rewritten
                copy = packed
        small = None
        if hidden.shape[0] <= _KERNEL_ROWS:
            small = small_linear(hidden.float(), weight, copy, self.decode_paths().by_torch)
        if small is not None:
            return small.float()
        if copy is not None:
            return linear(hidden.to(weight.dtype), weight, copy).float()
        work = compute_dtype(weight.dtype, weight.device) if hidden.shape[0] > 1 else weight.dtype
        hidden = hidden.to(work)
        if weight.device.type == "cpu" and weight.shape[0] > 2 * _HEAD_SLICE:
            parts = [F.linear(hidden, w.to(work)) for w in torch.split(weight, _HEAD_SLICE)]
            return torch.cat(parts, dim=-1).float()
        return F.linear(hidden, weight.to(work)).float()


def _decoder_layer(
    w: LayerWeights,
    x: Tensor,
    rope: Tensor,
    cache: tuple[Tensor, Tensor],
    batch: AttentionBatch,
    layer: int,
    shape: tuple[int, int, int],
    eps: float,
    by_torch: bool = False,
) -> Tensor:
    """Pre-norm grouped-query attention over the paged cache, then the pre-norm SwiGLU MLP.

    The step's new K/V go into the cache before attention, so a sequence may attend to blocks
    another sequence of the same step wrote. One or two rows' products through torch's kernels
    where `by_torch` (the model's decode paths), else the compiled loops.
    """
    heads, kv_heads, dim = shape
    n = x.shape[0]
    sizes = [heads * dim, kv_heads * dim, kv_heads * dim]
    # one or two rows on a CPU: the layer's work around attention in two compiled calls (where
    # the copies are AMX's tiles, the staged calls below: the tiles stream one row faster)
    made = None
    packed = w.packed or (None, None, None, None)
    few = n <= _KERNEL_ROWS and x.device.type == "cpu" and not isinstance(packed[0], Tiles)
    if w.qkv is not None and w.gate_up is not None and few:
        rotated = sizes[0] + sizes[1]
        made = layer_in(x, w.norms32[0], eps, w.qkv, rope[:, 0], rotated, dim, packed[0], by_torch)
    if made is not None and batch.lane is not None:  # a lone lane: q, K and V stored in one call
        lane = (batch.lane.keys[layer], batch.lane.values[layer])
        queries = lane_put(made, sizes[0] + sizes[1], cache, batch.lane.slot, lane, batch.lane.length)
        if queries is not None:
            attended = lane_attention(queries.view(1, heads, dim), None, None, batch.lane, layer)
            return _layer_after_attention(w, x, attended, eps, made, by_torch)
    staged = None  # three rows and more of a bf16 model with packed copies: compiled stages
    if made is None and w.packed is not None and x.device.type == "cpu" and w.qkv is not None:
        staged = staged_in(x, w.input_norm, eps, w.packed[0], rope[:, 0], sizes[0] + sizes[1], dim)
    if (row := made if made is not None else staged) is not None:
        q, k, v = torch.split(row, sizes, dim=-1)
        q, k = q.view(n, heads, dim), k.view(n, kv_heads, dim)
    else:
        h = _rms_norm(x, w.input_norm, eps)
        if w.qkv is not None and (n <= _KERNEL_ROWS or w.packed is not None):
            q, k, v = torch.split(linear(h, w.qkv, packed[0], by_torch), sizes, dim=-1)
        else:
            q, k, v = linear(h, w.q), linear(h, w.k), linear(h, w.v)
        q = _rotate(q.view(n, heads, dim), rope)
        k = _rotate(k.view(n, kv_heads, dim), rope)
    v = v.view(n, kv_heads, dim)
    k_cache, v_cache = cache
    k_cache.index_copy_(0, batch.write_slots, _as(k, k_cache.dtype))
    v_cache.index_copy_(0, batch.write_slots, _as(v, v_cache.dtype))
    # the shared-prefix products in the arithmetic's dtype; SDPA (the lane, a prefill, a mixed
    # step) in the one its kernels run fastest in
    work = (compute_dtype if batch.prefixes else sdpa_dtype)(x.dtype, x.device)
    q, k, v = _as(q, work), _as(k, work), _as(v, work)
    if batch.lane is not None:
        attended = lane_attention(q, k, v, batch.lane, layer)
    elif batch.spans is not None:
        attended = causal_attention(q, k, v, batch.spans)
    else:
        attended = paged_attention(q, k_cache, v_cache, batch, layer)
    if staged is not None and w.packed is not None:
        out = staged_out(attended, w.packed[1], x, w.post_norm, eps, w.packed[2], w.packed[3])
        if out is not None:
            return out
    return _layer_after_attention(w, x, attended, eps, made, by_torch)


def _layer_after_attention(
    w: LayerWeights, x: Tensor, attended: Tensor, eps: float, made: Tensor | None, by_torch: bool
) -> Tensor:
    """The o product and its residual, then the pre-norm SwiGLU MLP and its residual: in two
    compiled calls where `layer_in` made the layer's q|k|v (`made`), in eager ones otherwise."""
    packed = w.packed or (None, None, None, None)
    if made is not None:
        assert w.gate_up is not None
        copies = (w.packed[1], w.packed[2], w.packed[3]) if w.packed else None
        out = layer_out(attended, w.o, x, w.norms32[1], eps, w.gate_up, w.down, copies, by_torch)
        if out is not None:
            return out
    x = linear(_as(attended, x.dtype), w.o, packed[1], by_torch).add_(x)
    h = _rms_norm(x, w.post_norm, eps)
    if w.gate_up is not None and (x.shape[0] <= _KERNEL_ROWS or w.packed is not None):
        gate, up = linear(h, w.gate_up, packed[2], by_torch).chunk(2, -1)
    else:
        gate, up = linear(h, w.gate), linear(h, w.up)
    hidden = F.silu(gate, inplace=True).mul_(up)
    return linear(hidden, w.down, packed[3], by_torch).add_(x)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Root-mean-square norm, computed in fp32 as the reference does (in place where it can:
    a fresh tensor per operation costs page faults at prefill sizes)."""
    x32 = x.float()
    scale = x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    if x.dtype == torch.float32:
        return (x32 * scale).mul_(weight)
    return weight * (x32 * scale).to(x.dtype)


def _rotate(x: Tensor, rope: Tensor) -> Tensor:
    """RoPE in fp32 as one complex product: `build_model` stores each head's Q/K rows with
    the rotated pairs side by side (the GGUF's own order), which leaves q . k unchanged."""
    x32 = x.float()
    pairs = torch.view_as_complex(x32.view(*x.shape[:-1], -1, 2))
    return _as(torch.view_as_real(pairs * rope).view(x.shape), x.dtype)


def _as(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def _pair_rotated_rows(weight: Tensor, heads: int) -> Tensor:
    """Q/K rows from rotate-half order (dims j and j + D/2 rotate together) to pairs side by
    side (2j, 2j + 1), per head."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def build_model(
    checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, *, paths: DecodePaths | None = None
) -> CausalLM:
    """Instantiate the decoder on `device` in `dtype` with the checkpoint's weights, laid out
    for the decode paths chosen for it at torch's threads now (`_decode_paths`; `paths`, a
    choice made already: a test's)."""
    with torch.device("meta"):
        model = CausalLM(checkpoint.args)
    a = checkpoint.args
    # (compiles or loads the kernels, and measures what no rule decides, before any request)
    paths = paths or choose_paths(Shape.of(a), dtype, device)
    tensors = {name: _rope_paired(name, t, a) for name, t in checkpoint.tensors.items()}
    state: dict[str, Tensor] = {}
    memory = Arena.of([t.shape for t in tensors.values()], dtype, device)
    if device.type == "cpu":  # in the order a step reads them; each group one product of the
        for i, layer in enumerate(model.model.layers):  # decode step's one or two rows
            fused = []
            for group in _LAYER_READ_ORDER:
                names = [f"model.layers.{i}.{m}.weight" for m in group]
                matrix, views = _rows_of([tensors[n] for n in names], memory)
                state.update(zip(names, views, strict=True))
                if len(names) > 1:
                    fused.append(matrix)
            cast(DecoderLayer, layer).fused = (fused[0], fused[1])
    # copied even where nothing changes: read from the memory-mapped cache file, decode steps
    # were slower and stalled now and then for most of a second (see docs/engine.md)
    rest = [name for name in tensors if name not in state]
    for name in sorted(rest, key=lambda n: _LAST_READ.get(n, len(_LAST_READ))):
        state[name] = memory.empty(tensors[name].shape).copy_(tensors[name])
    if a.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if a.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if paths.packed != "none":
        _pack_copies(model, tiled=paths.packed == "tiles")
    model.inv_freq = rope_inv_freq(checkpoint.args).to(device)  # buffers are not in the state dict
    model.arena = memory
    model.paths = paths
    return model.eval()


# the weights read after the layers, in order (a tied embedding is the head)
_LAST_READ = {"model.norm.weight": 0, "lm_head.weight": 1, "model.embed_tokens.weight": 2}
# a layer's weights in the order its step reads them; a group of several is one fused matrix
_LAYER_READ_ORDER = (
    ("input_layernorm",),
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("post_attention_layernorm",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


def _rope_paired(name: str, tensor: Tensor, args: ModelArgs) -> Tensor:
    """A checkpoint tensor as the model keeps it: Q/K rows with rotated pairs side by side."""
    if name.endswith("self_attn.q_proj.weight"):
        return _pair_rotated_rows(tensor, args.num_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return _pair_rotated_rows(tensor, args.num_kv_heads)
    return tensor


def _pack_copies(model: CausalLM, *, tiled: bool) -> None:
    """A packed copy of every layer's four matrices and of the head (`_arith.packs`): in AMX's
    tiles where the decode paths say (this CPU has them and they stream faster at this thread
    count, `_trials.tiles_read_faster`), one block on huge pages in read order as the weights
    are; in oneDNN's layout otherwise.

    Kept beside the `[out, in]` weights, which the one- and two-row kernels read: the copies
    cost the model's matrices again (SmolLM2 in bf16: 212 MB for the layers, 57 MB for the
    head), bought for the decode steps of 3 to 64 lanes, where they make the products about
    twice as fast."""
    layers = cast(list[DecoderLayer], list(model.model.layers))
    sources = []
    for layer in layers:
        assert layer.fused is not None, "packed copies are made of the fused matrices"
        qkv, gate_up = layer.fused
        sources.append((qkv, layer.self_attn.o_proj.weight, gate_up, layer.mlp.down_proj.weight))
    head = model.lm_head.weight
    matrices = [m for group in sources for m in group] + [head]
    memory = Arena.of([tile_shape(m) for m in matrices], torch.int32, head.device) if tiled else None

    def copy(matrix: Tensor) -> Tensor | Tiles:
        return tile(matrix.detach(), memory) if tiled else pack(matrix.detach())

    for layer, group in zip(layers, sources, strict=True):
        layer.packed = (group, tuple(t._version for t in group), tuple(copy(t) for t in group))
    model.head_packed = (head, head._version, copy(head))
    model.tiles_arena = memory


def _rows_of(weights: list[Tensor], memory: Arena) -> tuple[Tensor, list[Tensor]]:
    """Weights `[out, in]` one after another in one `[sum of outs, in]` matrix, in one copy
    each; and each weight as a view of its rows (contiguous, as `F.linear` reads them). A
    lone weight (a norm's, say) is copied as it is."""
    if len(weights) == 1:
        matrix = memory.empty(weights[0].shape).copy_(weights[0])
        return matrix, [matrix]
    matrix = memory.empty((sum(w.shape[0] for w in weights), weights[0].shape[1]))
    blocks = list(torch.split(matrix, [w.shape[0] for w in weights]))
    for weight, block in zip(weights, blocks, strict=True):
        block.copy_(weight)
    return matrix, blocks


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """RoPE inverse frequencies, computed in fp32 exactly as the reference implementation does."""
    # on the CPU even while a model is laid out on "meta": arithmetic on meta tensors imports
    # torch._dynamo, 2 s of a warm load's CPU time
    exponents = torch.arange(0, args.head_dim, 2, dtype=torch.int64, device="cpu").float() / args.head_dim
    return 1.0 / (args.rope_theta**exponents)
