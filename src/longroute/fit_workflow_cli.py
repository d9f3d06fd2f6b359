"""`longroute fit confidence|length|ltr|agent-outcomes`: Chimera's predictors from outcomes.

Registered on the ``fit`` sub-app by ``longroute.fit_cli``. Each fit command
reads an outcomes JSONL (``longroute fit agent-outcomes`` writes one), holds
out ``--held-out`` of the workflows (by ``program_id``), fits on the rest,
prints the held-out quality, then -- unless ``--no-refit`` -- refits on every
row and writes that model (the held-out figures describe the same recipe on
less data). scikit-learn and the generator are imported inside the commands,
so registering them keeps ``longroute --help`` fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

OutcomesArg = Annotated[
    Path, typer.Argument(metavar="OUTCOMES", help="Outcomes JSONL (longroute fit agent-outcomes).")
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Model file to write (joblib).")]
HeldOutOpt = Annotated[
    float,
    typer.Option(
        "--held-out",
        help="Share of workflows (program ids) held out to measure quality; 0 skips it.",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the split and of the fit.")]
RefitOpt = Annotated[
    bool,
    typer.Option(
        "--refit/--no-refit",
        help="Write a model refitted on every row (default) or the one the held-out "
        "quality was measured on.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def _read(path: Path) -> list[Any]:
    from longroute.workloads.agent_outcomes import read_outcomes

    try:
        return read_outcomes(path)
    except FileNotFoundError:
        raise _fail(f"{path}: no such outcomes file") from None
    except OSError as exc:
        raise _fail(f"{path}: cannot read the outcomes: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _fit_and_write(
    kind: str,
    outcomes_path: Path,
    out: Path,
    settings: tuple[float, int, bool],
    fit: Callable[[Sequence[Any]], Any],
    evaluate: Callable[[Any, Sequence[Any]], Any],
) -> tuple[dict[str, Any], Any]:
    """Split, fit, evaluate, refit, write; returns (summary, held-out quality or None)."""
    from longroute.estimators.workflow_eval import split_by_program
    from longroute.estimators.workflow_models import save_model

    held_out, seed, refit = settings
    rows = _read(outcomes_path)
    try:
        fit_rows, test_rows = split_by_program(rows, held_out, seed)
        model = fit(fit_rows)
        quality = evaluate(model, test_rows) if test_rows else None
        if refit and test_rows:
            model = fit(rows)
    except ValueError as exc:
        raise _fail(f"{outcomes_path}: {exc}") from None
    try:
        save_model(model, out)
    except OSError as exc:
        raise _fail(f"{out}: cannot write the {kind} model: {exc.strerror or exc}") from None
    summary = {
        "kind": kind,
        "out": str(out),
        "models": list(model.models),
        "num_rows": len(rows),
        "num_workflows": len({r.program_id for r in rows}),
        "num_held_out_rows": len(test_rows),
        "num_held_out_workflows": len({r.program_id for r in test_rows}),
        "held_out_fraction": held_out,
        "seed": seed,
        "is_refit": bool(refit and test_rows),
    }
    return summary, quality


def _finish(
    summary: dict[str, Any], held_out: Any, as_json: bool, table: Any, note: str = ""
) -> None:
    from longroute.metrics.tables import print_tables, result_console

    if as_json:
        typer.echo(json.dumps({**summary, "held_out": held_out}, sort_keys=True))
        return
    console = result_console()
    if table is not None:
        print_tables(console, [table])
        console.print(note, highlight=False, markup=False)
    fitted_on = (
        "every row"
        if summary["is_refit"] or not summary["num_held_out_rows"]
        else (f"{summary['num_rows'] - summary['num_held_out_rows']} rows (held-out ones left out)")
    )
    console.print(
        f"wrote {summary['out']} ({summary['kind']} model for {', '.join(summary['models'])}; "
        f"{summary['num_rows']} rows of {summary['num_workflows']} workflows, "
        f"fitted on {fitted_on})",
        highlight=False,
    )


def _rank_table(title: str, rows: Sequence[Any], names: Sequence[str]) -> Any:
    from longroute.metrics.tables import header, name_column, new_table, number_column

    table = new_table(escape(title))
    name_column(table, "model", [r.model for r in rows])
    number_column(table, header("rows"))
    for name in names:
        number_column(table, header(name, "0-1"))
    for r in rows:
        values = [r.predictor, r.fcfs, r.input_length, r.predictor_vs_remaining][: len(names)]
        table.add_row(escape(r.model), str(r.num_rows), *(f"{v:.3f}" for v in values))
    return table


def _rank_json(rows: Sequence[Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {"kendall_tau_distance": {r.model: asdict(r) for r in rows}}


def confidence_command(
    outcomes_path: OutcomesArg,
    out: OutOpt,
    held_out: HeldOutOpt = 0.2,
    seed: SeedOpt = 0,
    refit: RefitOpt = True,
    as_json: JsonOpt = False,
    c: Annotated[float, typer.Option("--c", help="Inverse L2 strength of each head.")] = 0.5,
) -> None:
    """Fit the semantic router q(m) (TF-IDF + one logistic head per model); report mAP."""
    from longroute.estimators.confidence import fit_confidence
    from longroute.estimators.workflow_eval import confidence_quality

    summary, quality = _fit_and_write(
        "confidence",
        outcomes_path,
        out,
        (held_out, seed, refit),
        lambda rows: fit_confidence(rows, seed=seed, regularization_c=c),
        confidence_quality,
    )
    table, held = None, None
    if quality is not None:
        average_precision, correct_share = quality
        table = _confidence_table(average_precision, correct_share)
        held = {"average_precision": average_precision, "correct_share": correct_share}
    note = (
        "AP: average precision of q(m) for a correct answer on the held-out rows of model m "
        "(a random score's AP is the correct share); macro: the models' mean. "
        "Chimera's Table 2: 0.595-0.631 with ModernBERT."
    )
    _finish(summary, held, as_json, table, note)


def _confidence_table(average_precision: dict[str, float], share: dict[str, float]) -> Any:
    from longroute.metrics.tables import header, name_column, new_table, number_column

    table = new_table("semantic router on held-out workflows")
    name_column(table, "model", list(average_precision))
    number_column(table, header("AP", "0-1"))
    number_column(table, header("correct share", "0-1"))
    for name, value in average_precision.items():
        table.add_row(escape(name), f"{value:.3f}", f"{share[name]:.3f}")
    return table


def length_command(
    outcomes_path: OutcomesArg,
    out: OutOpt,
    held_out: HeldOutOpt = 0.2,
    seed: SeedOpt = 0,
    refit: RefitOpt = True,
    as_json: JsonOpt = False,
    quantile: Annotated[float, typer.Option(help="Quantile predicted, in (0, 1).")] = 0.5,
    num_trees: Annotated[int, typer.Option(help="Trees per model's forest.")] = 64,
    min_samples_leaf: Annotated[int, typer.Option(help="Fewest rows in a leaf.")] = 10,
    max_tree_depth: Annotated[int, typer.Option(help="Deepest a tree grows.")] = 16,
    svd_components: Annotated[int, typer.Option(help="SVD components of the text.")] = 24,
) -> None:
    """Fit the remaining-output quantile forests (one per model); report Kendall-tau distance."""
    from longroute.estimators.workflow_eval import length_quality
    from longroute.estimators.workflow_length import fit_length

    def fit(rows: Sequence[Any]) -> Any:
        return fit_length(
            rows,
            seed=seed,
            quantile=quantile,
            num_trees=num_trees,
            min_samples_leaf=min_samples_leaf,
            max_tree_depth=max_tree_depth,
            svd_components=svd_components,
        )

    summary, quality = _fit_and_write(
        "length",
        outcomes_path,
        out,
        (held_out, seed, refit),
        fit,
        lambda model, rows: length_quality(model, rows, seed=seed),
    )
    table = None
    if quality is not None:
        table = _rank_table(
            "Kendall-tau distance to the remaining output, held-out workflows",
            quality,
            ("QRF", "FCFS", "input length"),
        )
    note = (
        "Share of request pairs ordered against their true remaining output (0: the oracle "
        "STJF order, 0.5: random). FCFS: arrival order; input length: prompt tokens, shortest "
        "first. Chimera's Table 3: QRF 0.155-0.262, FCFS ~0.50, input length 0.507-0.635."
    )
    _finish(summary, None if quality is None else _rank_json(quality), as_json, table, note)


def ltr_command(
    outcomes_path: OutcomesArg,
    out: OutOpt,
    held_out: HeldOutOpt = 0.2,
    seed: SeedOpt = 0,
    refit: RefitOpt = True,
    as_json: JsonOpt = False,
    c: Annotated[float, typer.Option("--c", help="Inverse L2 strength.")] = 0.3,
) -> None:
    """Fit the LTR baseline's pairwise ranker on each stage's own output; report its order."""
    from longroute.estimators.length_rank import fit_ranker
    from longroute.estimators.workflow_eval import ranker_quality

    summary, quality = _fit_and_write(
        "ranker",
        outcomes_path,
        out,
        (held_out, seed, refit),
        lambda rows: fit_ranker(rows, seed=seed, regularization_c=c),
        lambda model, rows: ranker_quality(model, rows, seed=seed),
    )
    table = None
    if quality is not None:
        table = _rank_table(
            "Kendall-tau distance to the own-stage output, held-out workflows",
            quality,
            ("LTR", "FCFS", "input length", "LTR vs remaining"),
        )
    note = (
        "Share of request pairs ordered against each request's own output (0: the oracle SJF "
        "order, 0.5: random). LTR vs remaining: the same score against the workflow's "
        "remaining output, the order Chimera's STJF wants."
    )
    _finish(summary, None if quality is None else _rank_json(quality), as_json, table, note)


def agent_outcomes_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Outcomes JSONL to write.")],
    num_workflows: Annotated[int, typer.Option(help="Workflow executions to draw.")] = 4000,
    seed: Annotated[int, typer.Option(help="Seed of the generator.")] = 7,
    models: Annotated[
        str, typer.Option(help="Models every workflow is run on, comma-separated.")
    ] = "qwen2.5-1.5b,qwen2.5-7b",
) -> None:
    """Generate offline outcomes: every agent-workflows draw run whole on every model."""
    from longroute.workloads.agent_outcomes import write_outcomes
    from longroute.workloads.agent_workflows import agent_outcomes, agent_workflows

    names = tuple(m.strip() for m in models.split(",") if m.strip())
    if not names:
        raise _fail(f"--models {models!r}: name at least one model, e.g. qwen2.5-1.5b,qwen2.5-7b")
    try:
        workload = agent_workflows(num_workflows=num_workflows, seed=seed, models=names)
        rows = agent_outcomes(workload)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        count = write_outcomes(rows, out)
    except OSError as exc:
        raise _fail(f"{out}: cannot write the outcomes: {exc.strerror or exc}") from None
    Console().print(
        f"wrote {out} ({count} rows: {num_workflows} workflows x {len(names)} models, seed {seed})",
        highlight=False,
    )
