"""`longroute fit ...`: offline fitting of LAAR's and Chimera's models (sub-app of longroute.cli).

`capability` (LAAR) lives here; `confidence`, `length`, `ltr` and
`agent-outcomes` (Chimera, issue 16) in longroute.fit_workflow_cli.

Fitting code (numpy, scikit-learn) is imported inside the commands, so
registering the sub-app keeps `longroute --help` fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from longroute.cli_options import Command, Group
from longroute.features.length import DEFAULT_BUCKET_EDGES_TOKENS, bucket_label, check_bucket_edges

fit_app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    help="Fit LAAR's and Chimera's models from observed outcomes.",
)


@fit_app.callback()
def _fit_root() -> None:
    """Keeps `capability` a subcommand even while it is the only one."""


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def _parse_edges(text: str) -> tuple[int, ...]:
    try:
        return check_bucket_edges([int(p) for p in text.split(",") if p.strip()])
    except ValueError as exc:
        raise ValueError(
            f"--bucket-edges {text!r}: {exc} (give increasing integers, e.g. 4096,8192,16384)"
        ) from None


@fit_app.command("capability", cls=Command)
def capability_command(
    outcomes_path: Annotated[
        Path, typer.Argument(metavar="OUTCOMES", help="Outcomes JSONL (see docs/laar.md).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Capability JSON file to write.")],
    interactions: Annotated[
        bool,
        typer.Option(
            "--interactions/--no-interactions", help="Fit language x length-bucket terms."
        ),
    ] = True,
    c: Annotated[
        float, typer.Option("--c", help="Inverse L2 regularisation strength (larger: weaker).")
    ] = 10.0,
    bucket_edges: Annotated[
        str,
        typer.Option(help="Upper edges of the length buckets in tokens, comma-separated."),
    ] = ",".join(str(e) for e in DEFAULT_BUCKET_EDGES_TOKENS),
) -> None:
    """Fit Q(m,x), P(model answers correctly), from an outcomes file; write it as JSON."""
    from longroute.estimators.capability import save_capability
    from longroute.estimators.capability_fit import calibration, fit_capability, read_outcomes

    try:
        edges = _parse_edges(bucket_edges)
        outcomes = read_outcomes(outcomes_path)
        capability = fit_capability(
            outcomes, bucket_edges_tokens=edges, is_interactions=interactions, regularization_c=c
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        save_capability(capability, out)
    except OSError as exc:
        raise _fail(f"{out}: cannot write the capability file: {exc.strerror or exc}") from None
    from longroute.metrics.tables import (
        header,
        name_column,
        new_table,
        number_column,
        print_tables,
        result_console,
    )

    console = result_console()
    rows = calibration(capability, outcomes)
    for model in capability.models:
        mine = [r for r in rows if r.model == model]
        table = new_table(
            escape(f"{model}: fitted Q vs observed"),
            caption="Q: the fitted probability of a correct answer; observed: the share correct.",
        )
        languages = [r.language.value if r.language is not None else "(none)" for r in mine]
        name_column(table, "language", languages)
        name_column(
            table, header("length", "tokens"), [bucket_label(r.bucket_edge_tokens) for r in mine]
        )
        for name, unit in (("outcomes", None), ("observed", "0-1"), ("fitted Q", "0-1")):
            number_column(table, header(name, unit))
        for language, r in zip(languages, mine, strict=True):
            table.add_row(
                language,
                bucket_label(r.bucket_edge_tokens),
                str(r.num_outcomes),
                f"{r.observed_rate:.3f}",
                f"{r.fitted_probability:.3f}",
            )
        print_tables(console, [table])
    console.print(
        f"wrote {out} ({len(capability.models)} models, {len(outcomes)} outcomes, "
        f"{'with' if interactions else 'without'} language x bucket interactions, C={c:g})",
        highlight=False,
    )


def _register_workflow_commands() -> None:
    """Chimera's predictors; their module imports no numpy or scikit-learn at load."""
    from longroute.fit_workflow_cli import (
        agent_outcomes_command,
        confidence_command,
        length_command,
        ltr_command,
    )

    fit_app.command("confidence", cls=Command)(confidence_command)
    fit_app.command("length", cls=Command)(length_command)
    fit_app.command("ltr", cls=Command)(ltr_command)
    fit_app.command("agent-outcomes", cls=Command)(agent_outcomes_command)


_register_workflow_commands()
