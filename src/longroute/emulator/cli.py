"""`longroute emulate`: the command function (registered by longroute.cli)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from longroute.emulator.options import DEFAULT_PORT, DEFAULT_PREFIX_BLOCK_TOKENS, EmulatorOptions


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def _params(flag: str, items: list[str] | None) -> dict[str, object]:
    """``KEY=VALUE`` policy parameters; values read as YAML scalars (``0.05`` is a float)."""
    import yaml

    params: dict[str, object] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} wants KEY=VALUE, got {item!r}")
        try:
            params[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ValueError(f"{flag} {item!r}: the value is not a YAML scalar") from None
    return params


def emulate_command(
    profile: Annotated[str, typer.Option(help="Model profile to emulate (see `simulate --list`).")],
    hardware: Annotated[str, typer.Option(help="Hardware profile or engine file.")] = "h100",
    num_gpus: Annotated[int, typer.Option(help="GPUs (tensor parallel).")] = 1,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = DEFAULT_PORT,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model name clients use (default: the profile name).")
    ] = None,
    speed: Annotated[
        float, typer.Option(help="Time factor: 10 runs the engine 10x faster than real time.")
    ] = 1.0,
    max_num_seqs: Annotated[int, typer.Option(help="Most sequences in a batch.")] = 256,
    max_num_batched_tokens: Annotated[
        int, typer.Option(help="Token budget of one engine iteration (chunked prefill).")
    ] = 8192,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="Context limit in tokens (default: the model's, capped by KV memory)."),
    ] = None,
    prefix_block_tokens: Annotated[
        int, typer.Option(help="Tokens per prefix-cache block.")
    ] = DEFAULT_PREFIX_BLOCK_TOKENS,
    network_delay_ms: Annotated[
        float,
        typer.Option(help="Round trip added to every request, emulated ms (stands for a region)."),
    ] = 0.0,
    network_delay_schedule: Annotated[
        str | None,
        typer.Option(
            help="Round trip over time: AT_S:DELAY_MS steps, comma-separated, in emulated "
            "seconds since start and emulated ms, e.g. 0:40,30:400,60:40; each holds until "
            "the next (before the first: --network-delay-ms). AT_S:down takes the region "
            "down until the next step (every connection but --admin's is cut)."
        ),
    ] = None,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="Serve GET/POST /admin/network-delay (read or set the round trip, or "
            "take the region down, live; a set overrides the schedule from then on). "
            "Off: no /admin path exists.",
        ),
    ] = False,
    error_rate: Annotated[
        float, typer.Option(help="Fraction of requests answered 500 before any byte.")
    ] = 0.0,
    hang_rate: Annotated[float, typer.Option(help="Fraction of requests never answered.")] = 0.0,
    crash_after_tokens: Annotated[
        int | None, typer.Option(help="Cut crashing streams after this many tokens.")
    ] = None,
    crash_rate: Annotated[
        float, typer.Option(help="Fraction of streamed responses cut (needs --crash-after-tokens).")
    ] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault decisions.")] = 0,
    accuracy_table: Annotated[
        str | None,
        typer.Option(
            help="Accuracy table (built-in name, e.g. laar-default, or a YAML path): KV-lookup "
            "prompts get right or wrong answers as it says (default: answers not modelled)."
        ),
    ] = None,
    temperature: Annotated[
        float,
        typer.Option(
            help="Decoding temperature of the correctness oracle: 0 = the same prompt always "
            "gets the same verdict; > 0 = independent verdicts per attempt."
        ),
    ] = 0.0,
    correctness_seed: Annotated[
        int, typer.Option(help="Seed of the correctness verdicts (needs --accuracy-table).")
    ] = 0,
    poison_marker: Annotated[
        str | None,
        typer.Option(
            help="Prompts containing this text are answered 500 every time, like a prompt "
            "the engine cannot handle (default: none)."
        ),
    ] = None,
    scheduler: Annotated[
        str,
        typer.Option(
            help="Queue policy of the engine: fcfs (vLLM's), Medha's edf, lrs, lars "
            "(slack-aware; requests get the default TTFT deadline), or priority (vLLM's "
            "--scheduling-policy priority: by each request's 'priority' field) and stjf "
            "(the same with Chimera's aging)."
        ),
    ] = "fcfs",
    packer: Annotated[
        str,
        typer.Option(
            help="Batch packer: token-budget (vLLM's chunked prefill) or time-budget (Medha's)."
        ),
    ] = "token-budget",
    scheduler_param: Annotated[
        list[str] | None,
        typer.Option(help="Queue-policy parameter KEY=VALUE (repeatable), e.g. default_ttft_s=2."),
    ] = None,
    packer_param: Annotated[
        list[str] | None,
        typer.Option(help="Packer parameter KEY=VALUE (repeatable), e.g. t_target_s=0.05."),
    ] = None,
    kv_events_config: Annotated[
        str | None,
        typer.Option(
            help="Publish KV-cache events as vLLM does: a JSON object of vLLM's keys, e.g. "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
            '"tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}\' '
            "(also buffer_steps, hwm, max_queue_size). An endpoint with * is bound, "
            "others are connected to."
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="A Hugging Face model folder (tokenizer.json and a chat template, e.g. the "
            "one vLLM serves): prompts are tokenized as that engine does, so token counts, "
            "prefix-cache blocks and KV events use real token ids (default: pseudo-tokens, "
            "about half as many)."
        ),
    ] = None,
) -> None:
    """Serve an OpenAI-compatible engine emulator timed by the simulator's engine model."""
    import zmq

    from longroute.emulator.correctness import build_judge
    from longroute.emulator.kv_events_config import parse_kv_events_config
    from longroute.emulator.network import parse_schedule
    from longroute.emulator.options import build_endpoint, build_engine_policies, build_predictor
    from longroute.emulator.runner import run_emulator
    from longroute.emulator.tokenizer import load_engine_tokenizer
    from longroute.sim.engine_policies import PolicyBuilder

    try:
        options = EmulatorOptions(
            profile=profile,
            hardware=hardware,
            num_gpus=num_gpus,
            host=host,
            port=port,
            served_model_name=served_model_name,
            speed=speed,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len_tokens=max_model_len,
            prefix_block_tokens=prefix_block_tokens,
            network_delay_ms=network_delay_ms,
            network_delay_schedule=(
                () if network_delay_schedule is None else parse_schedule(network_delay_schedule)
            ),
            admin_enabled=admin,
            error_rate=error_rate,
            hang_rate=hang_rate,
            crash_rate=crash_rate,
            crash_after_tokens=crash_after_tokens,
            seed=seed,
            accuracy_table=accuracy_table,
            temperature=temperature,
            correctness_seed=correctness_seed,
            poison_marker=poison_marker,
            scheduler=scheduler,
            packer=packer,
            scheduler_params=_params("--scheduler-param", scheduler_param),
            packer_params=_params("--packer-param", packer_param),
            kv_events=(
                None if kv_events_config is None else parse_kv_events_config(kv_events_config)
            ),
            tokenizer_dir=tokenizer,
        )
        # unknown profiles (ProfileError), a model that does not fit, bad limits
        predictor = build_predictor(options)
        endpoint = build_endpoint(options, predictor)
        # unknown policy names were refused above; here, their parameters
        PolicyBuilder(build_engine_policies(options)).build(endpoint, predictor)
        build_judge(options)  # an unknown table, or one without the served model
        if tokenizer is not None:  # a missing folder or tokenizer.json, a broken template
            load_engine_tokenizer(tokenizer, options.prefix_block_tokens)
    except ValueError as exc:
        raise _fail(str(exc)) from None

    def on_ready(url: str) -> None:
        print(f"emulator {options.model_name} listening on {url}", file=sys.stderr, flush=True)

    try:
        run_emulator(options, on_ready)
    except OSError as exc:  # e.g. the port is taken
        raise _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except zmq.ZMQError as exc:  # a KV-event endpoint that cannot be bound or parsed
        raise _fail(f"cannot open the KV-event sockets: {exc}") from None
    except KeyboardInterrupt:
        pass
