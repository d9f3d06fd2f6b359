"""The engine's limits, read from outside: ``/v1/models`` and ``/metrics``, or probed.

Called once per run, before the grid is planned. ``max_model_len`` comes from the
model's ``/v1/models`` entry (vLLM, SGLang and the emulator report it); without it
the profiler probes: prompts of doubling length until the engine refuses one
(HTTP 400), up to ``probe_limit_tokens``, then bisecting to within 5%. KV capacity is vLLM's
``vllm:cache_config_info`` labels ``num_gpu_blocks`` x ``block_size``; without
them, the context limit, a lower bound (an engine must hold one longest
sequence), and the file says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from longroute.estimators.measured_engine import EngineLimits
from longroute.profiling.client import Api, EngineClient, TargetError
from longroute.profiling.measure import Prompts, calibrate

PROBE_START_TOKENS = 1024
MAX_BISECTIONS = 12


@dataclass(frozen=True, slots=True)
class Discovery:
    """What the first look at the target found."""

    api: Api
    limits: EngineLimits


def model_entry(body: str, model: str) -> dict[str, object]:
    """``model``'s entry in a ``/v1/models`` body; TargetError if absent or malformed."""
    try:
        data = json.loads(body)
    except ValueError:
        raise TargetError("/v1/models did not answer JSON") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise TargetError("/v1/models has no 'data' list")
    names = [e.get("id") for e in entries if isinstance(e, dict)]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            return entry
    shown = ", ".join(str(n) for n in names[:10]) or "none"
    raise TargetError(f"the target does not serve model {model!r}; it serves: {shown}")


def kv_from_metrics(text: str) -> tuple[int, int] | None:
    """(num_gpu_blocks, block_size) from vLLM's ``cache_config_info``, else None."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("vllm:cache_config_info"):
                    blocks = sample.labels.get("num_gpu_blocks", "")
                    size = sample.labels.get("block_size", "")
                    if blocks.isdigit() and size.isdigit() and int(blocks) and int(size):
                        return int(blocks), int(size)
    except ValueError:  # a page that is not Prometheus text: no limits from it
        return None
    return None


async def choose_api(client: EngineClient) -> Api:
    """``completions`` when the target serves it, else ``chat``."""
    try:
        await client.stream("hello world", 1, "completions")
    except TargetError as exc:
        if "HTTP 404" in str(exc) or "HTTP 405" in str(exc):
            await client.stream("hello world", 1, "chat")
            return "chat"
        raise
    return "completions"


async def _accepts(client: EngineClient, api: Api, prompts: Prompts, n: int) -> int | None:
    """Prompt tokens of a ``n``-token prompt the engine took, None when refused (400)."""
    try:
        result = await client.stream(prompts.make(n), 1, api)
    except TargetError as exc:
        if "HTTP 400" not in str(exc):
            raise
        return None
    return result.num_prompt_tokens


async def probe_max_len(client: EngineClient, api: Api, prompts: Prompts, limit: int) -> int:
    """About the longest prompt the engine accepts (plus its one output token): doubling
    until HTTP 400 (or ``limit``), then bisection to within 5%. O(log limit) requests."""
    accepted, refused, n = 0, None, PROBE_START_TOKENS
    while n <= limit:
        taken = await _accepts(client, api, prompts, n)
        if taken is None:
            refused = n
            break
        accepted, n = taken, n * 2
    if accepted == 0:
        raise TargetError(f"the engine refused a prompt of {PROBE_START_TOKENS} tokens")
    lo = accepted  # in target tokens: the word estimate may not move the counts
    for _ in range(MAX_BISECTIONS):
        if refused is None or refused <= 1.05 * lo:
            break
        mid = (lo + refused) // 2
        taken = await _accepts(client, api, prompts, mid)
        if taken is None:
            refused = mid
        else:
            lo, accepted = mid, max(accepted, taken)
    return accepted + 1


async def discover(client: EngineClient, prompts: Prompts, probe_limit_tokens: int) -> Discovery:
    """The API to use and the engine's limits (module doc); calibrates ``prompts``."""
    status, body = await client.get_text("/v1/models")
    if status != 200:
        raise TargetError(f"HTTP {status} from /v1/models")
    entry = model_entry(body, client.model)
    api = await choose_api(client)
    await calibrate(client, api, prompts)
    max_len = entry.get("max_model_len")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 2:
        max_len = await probe_max_len(client, api, prompts, probe_limit_tokens)
    status, text = await client.get_text("/metrics")
    kv = kv_from_metrics(text) if status == 200 else None
    if kv is None:
        limits = EngineLimits(
            max_model_len_tokens=max_len,
            kv_capacity_tokens=max_len,
            kv_capacity_source="lower bound: max_model_len (no vllm:cache_config_info)",
        )
    else:
        blocks, size = kv
        limits = EngineLimits(
            max_model_len_tokens=max_len,
            kv_capacity_tokens=blocks * size,
            kv_capacity_source="vllm:cache_config_info num_gpu_blocks x block_size",
            block_size_tokens=size,
        )
    return Discovery(api, limits)
