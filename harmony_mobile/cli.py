"""The `harmony` command.

This file is the composition root: each sub-command parses its flags and hands over to the
module that does the work (imported lazily, so `harmony --help` stays fast and `harmony info`
does not pay for executorch or coremltools).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from harmony_mobile.server.core.settings import Settings


class OneLineUsageErrors(typer.core.TyperGroup):
    """A usage error (an unknown option, a value out of range) ends the command the way its own
    checks do: one `error:` line and exit 2, which a log file or a pipe keeps whole, not a box of
    rich panels."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as error:
            if type(error).__name__ == "NoArgsIsHelpError":  # the help is already printed
                sys.exit(error.exit_code)
            context = getattr(error, "ctx", None)
            hint = f" (see '{context.command_path} --help')" if context is not None else ""
            click.echo(f"error: {error.format_message()}{hint}", file=sys.stderr)
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted!", file=sys.stderr)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)  # an exit code, or a command's None


app = typer.Typer(
    cls=OneLineUsageErrors,
    help="harmony-mobile: hybrid split federated learning on phones (train, bench, export, serve, demo).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a traceback's locals can hold tokens and secrets
)
# soft wrap: a line is never broken at 80 columns when the output is a log file or a pipe (one event,
# one line, grep-able); a terminal wraps it for display
console = Console(soft_wrap=True)


@app.callback()
def main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="also show third-party log lines and warnings")
    ] = False,
    log_file: Annotated[
        Path | None,
        typer.Option(
            help="where log lines go (default: $HARMONY_LOG_FILE or ~/.local/state/harmony-mobile/harmony.log)"
        ),
    ] = None,
) -> None:
    """Terminal for our progress and results; everything else to the log file."""
    from harmony_mobile.logs import configure_logging

    configure_logging(verbose, log_file)


def fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code=2)


def invalid(what: str, error) -> str:
    """A pydantic ValidationError in one line: each bad field with its message."""
    from rich.markup import escape

    from harmony_mobile.protocol.validation import validation_problems

    return escape(f"invalid {what}: {validation_problems(error.errors())}")


def read_yaml(path: Path, what: str):
    """A settings file's content; a missing or unparsable file ends the command in one line."""
    from harmony_mobile.yaml_files import YamlFileError
    from harmony_mobile.yaml_files import read_yaml as read

    try:
        return read(path, what)
    except YamlFileError as error:
        fail(str(error))


# What each extra of pyproject.toml lets a command import (an extra that includes another lists
# its modules too). A command checks its extra first, so a slim install that lacks it stops with
# one line naming the extra instead of an ImportError deep in a stack.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": (
        "fastapi",
        "uvicorn",
        "starlette",
        "pydantic_settings",
        "prometheus_client",
        "sqlalchemy",
        "onnxruntime",
    ),
    "train": ("torch", "dp_accounting", "sklearn", "mlxtend"),
    "export": (
        "torch",
        "executorch",
        "torchao",
        "coremltools",
        "onnx",
        "onnxscript",
        "onnxruntime",
        "sklearn",
        "mlxtend",
    ),
    "flower": ("torch", "flwr", "tomli_w", "dp_accounting", "sklearn", "mlxtend"),
}
# a replica that runs alignment rounds: the server plus torch (training g) and the ONNX writer
EXTRA_MODULES["alignment"] = (*EXTRA_MODULES["server"], "torch", "onnx", "onnxscript")
EXTRA_MODULES["bench"] = (
    "scipy",
    "matplotlib",
    "filelock",
    *EXTRA_MODULES["train"],
    *EXTRA_MODULES["export"],
)


def require_extras(command: str, *extras: str) -> None:
    from importlib.util import find_spec

    from rich.markup import escape

    missing = {extra: [m for m in EXTRA_MODULES[extra] if find_spec(m) is None] for extra in extras}
    missing = {extra: modules for extra, modules in missing.items() if modules}
    if not missing:
        return
    names = list(missing)
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    modules = sorted({m for ms in missing.values() for m in ms})
    # escaped: fail() prints rich markup, where [server] would be a style tag
    fail(
        escape(
            f"harmony {command} needs the {said} extra{'s' if len(names) > 1 else ''}: "
            f"pip install 'harmony-mobile[{','.join(names)}]' (not importable: {', '.join(modules)})"
        )
    )


def comma_list(text: str | None, flag: str) -> list[str] | None:
    """The names of a comma-separated flag (spaces around them dropped); None when the flag is not given."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        fail(f"{flag} {text!r}: an empty name (two commas in a row, or a trailing comma)")
    return names


def comma_ints(text: str | None, flag: str) -> list[int] | None:
    names = comma_list(text, flag)
    if names is None:
        return None
    try:
        return [int(name) for name in names]
    except ValueError:
        fail(f"{flag} {text!r}: expected comma-separated integers")


# Options of `harmony train` (DataRootOption also of `harmony bench`), named so that the signature
# reads as a list of settings. A train flag left at None is not passed on: the --config file's value
# (else TrainConfig's default) stands.
TrainRunDirArgument = Annotated[
    Path, typer.Argument(help="where the run is written (new, or the same run to resume)")
]
DatasetOption = Annotated[
    str | None, typer.Option(help="mnist5k, digits, mnist, fashion_mnist, cifar10, cifar100")
]
DataRootOption = Annotated[Path | None, typer.Option(help="folder with official dataset archives")]
LabelDpEpsilonOption = Annotated[
    float | None, typer.Option(help="label DP: randomized response on each row's token (off by default)")
]
FeatureClipOption = Annotated[
    float | None, typer.Option(help="L2 clip norm of every uploaded feature row (off by default)")
]
NoiseMultiplierOption = Annotated[
    float | None, typer.Option(help="Gaussian noise on uploaded features: std = multiplier * clip")
]
ConfigFileOption = Annotated[
    Path | None, typer.Option(help="YAML/JSON with TrainConfig fields (flags override it)")
]
EngineOption = Annotated[
    str,
    typer.Option(
        help="inprocess (default) | flower (Flower's Simulation Engine, one virtual SuperNode per client)"
    ),
]
MinRepliesOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="flower: a round with fewer client replies stops the run (resumable); default: the Flower settings'",
    ),
]


@app.command()
def train(
    run_dir: TrainRunDirArgument,
    dataset: DatasetOption = None,
    data_root: DataRootOption = None,
    partition: Annotated[str | None, typer.Option(help="family | dirichlet | shard")] = None,
    alpha: Annotated[float | None, typer.Option(help="Dirichlet alpha (partition=dirichlet)")] = None,
    tiers: Annotated[Path | None, typer.Option(help="tiers YAML (default: built-in)")] = None,
    clients_per_tier: Annotated[int | None, typer.Option()] = None,
    rounds: Annotated[int | None, typer.Option()] = None,
    clients_per_round: Annotated[int | None, typer.Option(help="0 = all clients every round")] = None,
    algorithm: Annotated[str | None, typer.Option(help="harmony or an ablation/baseline name")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    label_dp_epsilon: LabelDpEpsilonOption = None,
    feature_clip: FeatureClipOption = None,
    noise_multiplier: NoiseMultiplierOption = None,
    config: ConfigFileOption = None,
    engine: EngineOption = "inprocess",
    min_replies: MinRepliesOption = None,
    lineage_from: Annotated[
        Path | None,
        typer.Option(
            help="share this finished run's federation secret and label epoch (same numbers on purpose)"
        ),
    ] = None,
) -> None:
    """Train and meta-adapt front-ends and the server back-end (HARMONY or a baseline)."""
    flags = dict(
        dataset=dataset,
        data_root=str(data_root) if data_root else None,
        partition=partition,
        alpha=alpha,
        tiers_file=str(tiers) if tiers else None,
        clients_per_tier=clients_per_tier,
        rounds=rounds,
        clients_per_round=clients_per_round,
        algorithm=algorithm,
        seed=seed,
        label_dp_epsilon=label_dp_epsilon,
        feature_clip=feature_clip,
        noise_multiplier=noise_multiplier,
    )
    values = _config_file_values(config)
    values.update({k: v for k, v in flags.items() if v is not None})
    if engine not in ("inprocess", "flower"):
        fail(f"unknown engine {engine!r}: inprocess or flower")
    if engine == "inprocess" and min_replies is not None:
        fail("--min-replies is for --engine flower (in process every client replies)")
    require_extras("train", "flower" if engine == "flower" else "train")
    if lineage_from is not None:
        _share_lineage(lineage_from, run_dir)
    train_config, results = _train_with_engine(values, run_dir, engine, min_replies)
    _print_train_summary(train_config, run_dir, results)


def _share_lineage(source: Path, run_dir: Path) -> None:
    from harmony_mobile.run_dir import RunDirError
    from harmony_mobile.training import share_lineage

    try:
        share_lineage(source, run_dir)
    except (RunDirError, ValueError) as error:
        fail(str(error))


def _config_file_values(config: Path | None) -> dict:
    """The TrainConfig fields of a --config YAML/JSON file ({} without one)."""
    if config is None:
        return {}
    values = read_yaml(config, "config file") or {}
    if not isinstance(values, dict):
        fail(f"config file {config} must hold a mapping of TrainConfig fields")
    return values


def _train_with_engine(values: dict, run_dir: Path, engine: str, min_replies: int | None):
    """(TrainConfig, final metrics) of a run trained in process or on Flower's Simulation Engine;
    a bad configuration or run directory ends the command with its error."""
    from pydantic import ValidationError

    from harmony_mobile.run_dir import RunDirError
    from harmony_mobile.training import TrainConfig
    from harmony_mobile.training import train as run_training

    try:
        train_config = TrainConfig(**values)
        if engine == "flower":
            from harmony_mobile.flower.run import FlowerRunError, train_flower
            from harmony_mobile.flower.settings import FlowerSettings

            given = {"min_replies": min_replies} if min_replies is not None else {}
            settings = FlowerSettings(train_config=train_config, run_dir=str(run_dir), **given)
            try:
                return train_config, train_flower(settings)
            except FlowerRunError as error:
                fail(str(error))
        return train_config, run_training(train_config, run_dir)
    except ValidationError as error:
        fail(invalid("training configuration", error))
    except (RunDirError, ValueError, FileNotFoundError) as error:
        fail(str(error))


def _print_train_summary(train_config, run_dir: Path, results: dict) -> None:
    from harmony_mobile.training import summary_rows

    table = Table(title=f"{train_config.algorithm} on {train_config.dataset}: {run_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in summary_rows(results):
        table.add_row(name, value)
    console.print(table)


BenchProfileOption = Annotated[
    str,
    typer.Option(
        help="quick | fashion (the recurring benchmark) | standard | full | ... (benchmarks/configs/<name>.yaml) or a path to a profile YAML"
    ),
]
ExtendOption = Annotated[
    bool,
    typer.Option(
        help="add the --settings to the report already in the out folder, with its tuning picks "
        "(no tuning is run; the budget check runs on the added settings the profile checks)"
    ),
]

ReuseRunsOption = Annotated[
    list[Path] | None,
    typer.Option(
        help="another report's results.json (or folder); its recorded evaluation runs of the same "
        "setting, method and configuration (every algorithm setting, defaults included: runs recorded "
        "before records kept them are trained again) are read back instead of trained (with --resume; "
        "repeatable)"
    ),
]


@app.command()
def bench(
    profile: BenchProfileOption = "quick",
    out: Annotated[
        Path | None, typer.Option(help="report folder (default benchmarks/results/<profile>)")
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(help="where runs are written (default ~/.cache/harmony-mobile/bench/<profile>)"),
    ] = None,
    data_root: DataRootOption = None,
    resume: Annotated[
        bool, typer.Option(help="read back finished runs of the same configuration from the work dir")
    ] = False,
    seeds: Annotated[str | None, typer.Option(help="comma-separated seeds overriding the profile's")] = None,
    methods: Annotated[
        str | None, typer.Option(help="comma-separated methods overriding the profile's")
    ] = None,
    settings: Annotated[
        str | None, typer.Option(help="comma-separated setting names: only these of the profile's")
    ] = None,
    report_only: Annotated[
        bool, typer.Option(help="re-render the report from the out folder's results.json, no training")
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(min=1, help="independent runs in parallel worker processes (1 torch thread each)"),
    ] = 1,
    extend: ExtendOption = False,
    reuse_runs_from: ReuseRunsOption = None,
) -> None:
    """Run every method on the same partitions, tiers and budget over several seeds; write the report.

    `--resume` reads finished runs back from the work dir and redoes one killed half-way; a record
    of another configuration is refused, never deleted (without `--resume`, any record in a chosen
    `--work-dir` is). `--extend` adds settings one invocation at a time, the tuning ones first."""
    require_extras("bench", "bench")
    from pydantic import ValidationError

    from harmony_mobile.bench.runner import bench as run_bench

    try:
        run_bench(
            profile,
            out,
            work_dir,
            str(data_root) if data_root else None,
            resume,
            comma_ints(seeds, "--seeds"),
            comma_list(methods, "--methods"),
            log=console.print,
            report_only=report_only,
            jobs=jobs,
            settings=comma_list(settings, "--settings"),
            extend_report=extend,
            reuse_runs_from=reuse_runs_from,
        )
    except ValidationError as error:
        fail(invalid("benchmark profile", error))
    except (FileNotFoundError, ValueError) as error:
        fail(str(error))


class _ExportGroup(OneLineUsageErrors):
    """`harmony export RUN_DIR ...` runs the export (the `run` sub-command is implied);
    `harmony export verify DIR` checks an export directory."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


export_app = typer.Typer(
    cls=_ExportGroup,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Quantize and export a run's front-ends per device tier (.pte, .mlpackage, signed manifest).\n\n"
    "  harmony export RUN_DIR --out DIR [--tiers a,b] [--dynamic-batch N] [--key-dir DIR]\n\n"
    "  harmony export verify DIR [--public-key FILE]",
)
app.add_typer(export_app, name="export")


@export_app.command("run")
def export(
    run_dir: Annotated[Path, typer.Argument(help="a finished `harmony train` run directory")],
    out: Annotated[
        Path, typer.Option("--out", help="export directory to write (replaced only when complete)")
    ],
    tiers: Annotated[
        str | None,
        typer.Option("--tiers", help="comma-separated tier names (default: every tier of the run)"),
    ] = None,
    dynamic_batch: Annotated[
        int | None,
        typer.Option(
            "--dynamic-batch",
            min=1,
            help="max batch of every .pte (1 = static batch 1); default: the exporter's",
        ),
    ] = None,
    key_dir: Annotated[
        Path | None,
        typer.Option(
            "--key-dir", help="Ed25519 key directory (default ~/.config/harmony-mobile/keys; created)"
        ),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="torch and XNNPACK threads; default: the exporter's"),
    ] = None,
    allow_failed_variants: Annotated[
        bool,
        typer.Option(
            "--allow-failed-variants",
            help="ship a variant that failed its quality checks, marked failed in the manifest "
            "(default: the export fails and writes nothing)",
        ),
    ] = False,
) -> None:
    """(default) Export RUN_DIR to --out: fp32/int8 .pte, Core ML packages, back-end, report, signed manifest."""
    require_extras("export", "export")
    given = {"max_batch": dynamic_batch, "threads": threads}
    options = dict(
        tiers=comma_list(tiers, "--tiers"), key_dir=key_dir, allow_failed_variants=allow_failed_variants
    )
    options |= {name: value for name, value in given.items() if value is not None}
    _print_export_result(_export_or_fail(run_dir, out, options), key_dir)


def _export_or_fail(run_dir: Path, out: Path, options: dict):
    """The export's result; bad input exits 2 (nothing was written), a failed export 1."""
    from harmony_mobile.export.keys import SigningKeyError
    from harmony_mobile.export.pipeline import export_run
    from harmony_mobile.export.steps import ExportError, ExportInputError
    from harmony_mobile.run_dir import RunDirError

    try:
        return export_run(run_dir, out, console=console, **options)
    except (ExportInputError, RunDirError, SigningKeyError) as error:
        fail(str(error))
    except (ExportError, ValueError, OSError) as error:
        console.print(f"[red]export failed:[/red] {error}")
        raise typer.Exit(code=1) from None


def _print_export_result(result, key_dir: Path | None) -> None:
    """The exported artifacts, any quality check not met, a newly made key, the manifest."""
    console.print(_export_table(result))
    failing = [
        f"{t['tier']}: {name}"
        for t in result.report["tiers"]
        for name, ok in t["checks"].items()
        if ok is False
    ]
    if failing:
        console.print(
            f"[yellow]quality checks not met (see verification.md):[/yellow] {'; '.join(failing)}",
        )
    if result.key_created:
        console.print(
            f"[yellow]generated a new signing key in {key_dir or '~/.config/harmony-mobile/keys'}[/yellow]"
        )
    console.print(f"signed manifest: {result.out / 'manifest.json'} ({result.seconds:.0f} s)")


def _export_table(result) -> Table:
    table = Table(title=f"exported {result.out} (model version {result.manifest.model_version})")
    for column in (
        "tier",
        "variant",
        "verdict",
        "bytes",
        "max abs vs eager",
        "top-1 agree",
        ".pte / eager latency",
    ):
        table.add_column(column)
    verdicts = {(t.name, a.quantization): a.verdict for t in result.manifest.tiers for a in t.artifacts}
    for tier in result.report["tiers"]:
        for row in tier["pte"]:
            parity = row["vs_eager_fp32"]
            table.add_row(
                tier["tier"],
                row["quantization"],
                verdicts.get((tier["tier"], row["quantization"]), ""),
                f"{row['size']:,}",
                f"{max(parity['max_abs_logits'], parity['max_abs_features']):.2g}",
                f"{parity['top1_agreements']}/{parity['samples']}",
                f"{row['latency_batch1']['pte_over_eager']:.2f}",
            )
        for row in tier["coreml"]:
            table.add_row(
                tier["tier"], row["quantization"], "not checked", f"{row['size']:,}", "on a Mac", "", ""
            )
    return table


@export_app.command("verify")
def export_verify(
    directory: Annotated[Path, typer.Argument(help="an export directory")],
    public_key: Annotated[
        Path | None, typer.Option("--public-key", help="pinned signing_key.pub (default: the one in DIR)")
    ] = None,
) -> None:
    """Check the manifest signature and every file's sha256 and size; non-zero exit naming each mismatch."""
    from harmony_mobile.export.manifest import ManifestError, verify_manifest

    if not directory.is_dir():
        fail(f"{directory} is not a directory (give the folder `harmony export` wrote)")
    if public_key is not None and not public_key.is_file():
        fail(f"--public-key {public_key} is not a file")
    try:
        manifest = verify_manifest(directory, public_key)
    except ManifestError as error:
        console.print(f"[red]verification FAILED for {error.directory}:[/red]")
        for problem in error.problems:
            console.print(f"  [red]✗[/red] {problem}")
        raise typer.Exit(code=1) from None
    console.print(
        f"[green]OK[/green] {directory}: signature valid, {len(manifest.files)} files match "
        f"(model version {manifest.model_version}; tiers {', '.join(t.name for t in manifest.tiers)})",
    )
    if public_key is None:
        console.print(
            "[yellow]checked against the signing_key.pub inside the directory: this proves integrity, "
            "not origin; pass --public-key with the pinned key[/yellow]"
        )


@app.command("export-app")
def export_app_command(
    platform: Annotated[str, typer.Argument(help="android | ios")],
    export_dir: Annotated[Path, typer.Option("--export", help="a `harmony export` directory")] = Path(
        "demo-output/export"
    ),
    server_url: Annotated[
        str | None,
        typer.Option(
            help="fallback server the app calls (default: the host as the emulator/simulator sees it; "
            "a phone on the LAN needs http://<laptop IP>:8000)"
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run", help="training run whose federation secret the phones need (default: EXPORT/../run)"
        ),
    ] = None,
    pinned_key: Annotated[
        Path | None,
        typer.Option(
            "--pinned-key",
            help="the public key the app pins (android: signing_key_p256.pub, ios: signing_key.pub of "
            "your key directory); default: the key the app already pins. Never the export's own.",
        ),
    ] = None,
    payload_out: Annotated[
        Path | None,
        typer.Option(
            "--payload-out",
            help="where to write the provisioning payload, owner-only, outside the app trees "
            "(default: EXPORT/../provisioning-<platform>.txt)",
        ),
    ] = None,
    repo: Annotated[
        Path | None, typer.Option(help="repository checkout (default: found from the working directory)")
    ] = None,
) -> None:
    """Copy a verified export, the pinned key and a server URL into a demo app; the run's secret
    goes into a provisioning payload outside the app, never into it."""
    from harmony_mobile.export.apps import ExportAppError, find_repository, install
    from harmony_mobile.export.manifest import ManifestError
    from harmony_mobile.export.provisioning import ProvisioningError

    try:
        result = install(
            platform,
            export_dir,
            repo if repo is not None else find_repository(),
            server_url=server_url,
            run_dir=run_dir,
            pinned_key=pinned_key,
            payload_out=payload_out,
        )
    except (ExportAppError, ManifestError, ProvisioningError, OSError) as error:
        fail(str(error))
    _print_app_install(platform, result)


def _print_app_install(platform: str, result) -> None:
    console.print(
        f"[green]{platform}[/green]: model {result.model_version}, {len(result.copied)} files from "
        f"{result.export_dir}; server {result.server_url}",
    )
    for path in result.written:
        console.print(f"  wrote {path}")
    for path in result.removed:
        console.print(f"  removed {path} (a secret must not ship in the app)")
    console.print(
        f"provisioning payload (owner-only; deliver it to the phone as a QR code, deep link or managed "
        f"config, docs/PROVISIONING.md): {result.payload}",
    )


ProvisionExportOption = Annotated[
    Path | None,
    typer.Option(
        "--export",
        help="an export of this run: the payload names, per tier, the classes its front-end's "
        "phone holds (what a slot-gated tier gates by on a demo app)",
    ),
]
ProvisionPublicKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--public-key", help="pinned signing_key.pub the --export must be signed with (default: its own)"
    ),
]


@app.command("provision")
def provision_command(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="file to write the payload to (owner-only, outside the apps); - prints it"
        ),
    ],
    run_dir: Annotated[
        Path, typer.Option("--run", help="training run whose federation secret the phones get")
    ] = Path("demo-output/run"),
    server_url: Annotated[str | None, typer.Option(help="fallback server URL to include")] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            help="enrol a device first (POST /v1/devices on --server-url) with this admin token file"
        ),
    ] = None,
    tier: Annotated[
        str | None, typer.Option(help="the enrolled device's tier (with --admin-token-file)")
    ] = None,
    name: Annotated[str | None, typer.Option(help="the enrolled device's name")] = None,
    export_dir: ProvisionExportOption = None,
    public_key: ProvisionPublicKeyOption = None,
) -> None:
    """Write a provisioning payload: the run's federation secret (and, with --admin-token-file, a
    device enrolment; with --export, each tier's own classes) for one phone, as the deep link its QR
    code carries."""
    from harmony_mobile.export.provisioning import (
        Provisioning,
        ProvisioningError,
        payload_uri,
        provisioned_device,
        write_payload,
    )
    from harmony_mobile.run_dir import RunDirError

    secret_path = run_dir / "clients" / "federation_secret"
    if not secret_path.is_file():
        fail(f"{run_dir} holds no training run's federation secret ({secret_path}): pass --run RUN_DIR")
    _check_enrolment_flags(admin_token_file, server_url, tier, name)
    try:
        own = None if export_dir is None else _own_classes_of(run_dir, export_dir, public_key)
        device = None
        if admin_token_file is not None:
            device = _enrol_for_payload(server_url, admin_token_file, tier, name, provisioned_device)
        payload = payload_uri(Provisioning(secret_path.read_bytes(), server_url, device, own))
        if str(out) == "-":
            print(payload)
            return
        repo = _repository_or_none()
        written = write_payload(out, payload, [repo / "android_demo", repo / "ios_demo"] if repo else [])
    except (ProvisioningError, RunDirError, OSError) as error:
        fail(str(error))
    console.print(f"wrote {written} (owner-only: it holds the federation secret)")


def _check_enrolment_flags(admin_token_file: Path | None, server_url, tier, name) -> None:
    """--admin-token-file enrols a device, which needs --server-url and --tier; --tier and --name
    mean nothing without it."""
    if admin_token_file is None and (tier is not None or name is not None):
        fail("--tier and --name name the device --admin-token-file enrols: pass it too")
    if admin_token_file is not None and (server_url is None or tier is None):
        fail("--admin-token-file enrols a device: pass --server-url and --tier too")


def _own_classes_of(run_dir: Path, export_dir: Path, public_key: Path | None):
    """Each tier's own classes, read from the export's manifest once its signature and files check out."""
    from harmony_mobile.export.manifest import ManifestError, verify_manifest
    from harmony_mobile.export.provisioning import ProvisioningError, own_classes_of_export
    from harmony_mobile.run_dir import RunDir

    try:
        manifest = verify_manifest(export_dir, public_key)
    except ManifestError as error:
        raise ProvisioningError(f"{export_dir} does not verify: {'; '.join(error.problems)}") from None
    return own_classes_of_export(RunDir(run_dir), manifest, export_dir)


def _enrol_for_payload(server_url, admin_token_file: Path, tier, name, provisioned_device):
    from harmony_mobile.device.errors import DeviceError
    from harmony_mobile.device.fallback_client import enrol

    try:
        response = enrol(server_url.rstrip("/"), admin_token_file.read_text().strip(), tier, name)
    except (DeviceError, OSError) as error:
        fail(f"could not enrol a device at {server_url}: {error}")
    return provisioned_device(response)


def _repository_or_none() -> Path | None:
    from harmony_mobile.export.apps import ExportAppError, find_repository

    try:
        return find_repository()
    except ExportAppError:
        return None


UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


# the server's own settings read HARMONY_* themselves (server/core/settings.py); these are uvicorn's
HostOption = Annotated[str, typer.Option(envvar="HARMONY_HOST", help="bind address (put TLS in front)")]
PortOption = Annotated[
    int, typer.Option(min=0, max=65535, envvar="HARMONY_PORT", help="TCP port (0: any free one)")
]
WorkersOption = Annotated[
    int, typer.Option(min=1, envvar="HARMONY_WORKERS", help="server processes sharing the port")
]
LogLevelOption = Annotated[
    str, typer.Option(envvar="HARMONY_LOG_LEVEL", help=f"uvicorn log level: {' | '.join(UVICORN_LOG_LEVELS)}")
]


def _serve_settings(explicit: dict[str, Any], log_level: str = "info") -> Settings:
    """The server's settings, after checking that its model dir (if any) can be served."""
    from pydantic import ValidationError
    from rich.markup import escape

    from harmony_mobile.server.launch import ModelDirError, check_model_dir, resolve_settings
    from harmony_mobile.server.services.runtimes import RuntimeChoiceError, make_runtime

    if log_level not in UVICORN_LOG_LEVELS:
        fail(f"--log-level {log_level!r}: one of {', '.join(UVICORN_LOG_LEVELS)}")
    try:
        settings = resolve_settings(explicit)
    except ValidationError as error:
        fail(invalid("server settings", error))
    if settings.run_alignment and settings.runtime != "onnx":
        require_extras("serve", "alignment")  # rounds train g with torch (off: --no-alignment)
    try:
        runtime = make_runtime(settings)
    except RuntimeChoiceError as error:
        fail(escape(str(error)))  # escaped: [alignment] would be a rich style tag
    try:
        check_model_dir(settings.model_dir, runtime)
    except ModelDirError as error:
        fail(f"cannot serve this model dir: {error}")
    return settings


@app.command()
def serve(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="store, server key, back-end versions [env HARMONY_DATA_DIR; serve-data]"),
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="export dir: backend/backend.pt imported, manifest.json served")
    ] = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    workers: WorkersOption = 1,
    admin_token: Annotated[
        str | None, typer.Option(help="admin token [env HARMONY_ADMIN_TOKEN; default <data-dir>/admin_token]")
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            help="postgresql://user:pass@host/db to share the store between replicas [default SQLite]"
        ),
    ] = None,
    alignment: Annotated[
        bool | None, typer.Option("--alignment/--no-alignment", help="run alignment rounds in this replica")
    ] = None,
    max_batch: Annotated[
        int | None, typer.Option(help="rows per inference micro-batch (1 = no batching)")
    ] = None,
    max_wait_ms: Annotated[float | None, typer.Option(help="how long a micro-batch waits to fill")] = None,
    max_connections: Annotated[
        int | None, typer.Option(help="open connections per process; more get 503")
    ] = None,
    runtime: Annotated[
        str | None, typer.Option(help="back-end runtime: auto (torch if installed) | torch | onnx")
    ] = None,
    torch_threads: Annotated[int | None, typer.Option(help="torch.set_num_threads")] = None,
    onnx_threads: Annotated[int | None, typer.Option(help="ONNX Runtime intra-op threads")] = None,
    log_level: LogLevelOption = "info",
) -> None:
    r"""Run the FastAPI fallback server (protocol in docs/PROTOCOL.md). A flag left out keeps the value
    of its HARMONY_* environment variable (e.g. HARMONY_MAX_BATCH), else the default. Alignment
    rounds need the \[alignment] extra (torch); a --no-alignment replica runs on \[server] alone,
    serving the export's backend.onnx through ONNX Runtime (--runtime onnx, the default without torch)."""
    require_extras("serve", "server")
    explicit = dict(
        data_dir=data_dir,
        model_dir=model_dir,
        admin_token=admin_token,
        database_url=database_url,
        run_alignment=alignment,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_connections=max_connections,
        runtime=runtime,
        torch_threads=torch_threads,
        onnx_threads=onnx_threads,
    )
    settings = _serve_settings(explicit, log_level)
    _start(settings, explicit, host, port, workers, log_level)


def _start(settings: Settings, explicit: dict, host: str, port: int, workers: int, log_level: str) -> None:
    """Check that the server can start here (one line if not), say where it listens, and run it."""
    from harmony_mobile.server.launch import LaunchError, check_can_start, run

    try:
        check_can_start(settings, host, port)
    except LaunchError as error:
        fail(str(error))
    _announce(settings, host, port, workers)
    run(settings, explicit, host, port, workers, log_level)


def _announce(settings: Settings, host: str, port: int, workers: int) -> None:
    if settings.admin_token is None:
        console.print(f"admin token: {settings.data_dir / 'admin_token'} (mode 0600)")
    where = f"http://{host}:{port}" if port else f"a free port of {host} (uvicorn's line names it)"
    console.print(f"serving on {where} with {workers} process(es)  (status page /, metrics /metrics)")


@app.command()
def demo(
    out: Annotated[
        Path | None,
        typer.Option(help="output directory (run, export, server data, report); default: the demo's"),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="bundled data set: mnist5k or digits; default: the demo's")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(min=1, help="training rounds (default: the demo's small budget)")
    ] = None,
    drift_steps: Annotated[
        int | None,
        typer.Option(min=0, help="on-device training steps per phone (ExecuTorch training .pte)"),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="default: the demo's")] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(
            help="a split method (harmony-max-softmax: phones exit by max softmax); default: harmony"
        ),
    ] = None,
    reuse_run: Annotated[
        bool,
        typer.Option("--reuse-run", help="keep a finished training run in OUT/run with the same settings"),
    ] = False,
) -> None:
    """The whole product end to end on bundled data: train, export, serve, simulated phones, drift, alignment."""
    require_extras("demo", "server", "export", "train")
    from harmony_mobile.demo import DemoError, run_demo

    given = dict(
        out=out, dataset=dataset, rounds=rounds, drift_steps=drift_steps, seed=seed, algorithm=algorithm
    )
    config = _demo_config(reuse_run, {name: value for name, value in given.items() if value is not None})
    try:
        # piped output (make demo | tee, CI logs) gets a width at which the summary table fits
        run_demo(config, console if console.is_terminal else Console(width=170))
    except KeyboardInterrupt:
        console.print("[yellow]demo interrupted; the server was stopped[/yellow]")
        raise typer.Exit(code=130) from None
    except DemoError as error:
        fail(str(error))


def _demo_config(reuse_run: bool, given: dict):
    """The demo's settings, each checked before its first step: a bad one ends the command here."""
    from pydantic import ValidationError

    from harmony_mobile.data import DATASETS
    from harmony_mobile.demo import DemoConfig
    from harmony_mobile.training import build_algorithm, check_config

    config = DemoConfig(reuse_run=reuse_run, **given)
    if config.dataset not in DATASETS:
        fail(f"unknown dataset {config.dataset!r}: one of {', '.join(DATASETS)}")
    try:
        train_config = config.train_config()
        check_config(train_config)
    except ValidationError as error:
        fail(invalid("demo settings", error))
    except ValueError as error:
        fail(str(error))
    if not build_algorithm(train_config.algorithm, train_config.algorithm_config).uses_split:
        fail(
            f"--algorithm {train_config.algorithm!r}: the demo's phones fall back to a server: a split method"
        )
    return config


@app.command()
def info(
    tiers_file: Annotated[Path | None, typer.Option("--tiers", help="tiers YAML (default: built-in)")] = None,
    data_root: Annotated[Path | None, typer.Option(help="folder with CIFAR/MNIST archives")] = None,
) -> None:
    """Print versions, device tiers and which datasets are available."""
    from importlib.metadata import PackageNotFoundError, version

    tiers = _tiers_or_fail(tiers_file)  # a bad file ends the command before anything is printed
    versions = Table(title="versions")
    versions.add_column("package")
    versions.add_column("version")
    for package in (
        "harmony-mobile",
        "torch",
        "executorch",
        "torchao",
        "coremltools",
        "fastapi",
        "cryptography",
    ):
        try:
            versions.add_row(package, version(package))
        except PackageNotFoundError:
            versions.add_row(package, "[red]not installed[/red]")
    console.print(versions)

    tier_table = Table(title=f"device tiers ({tiers_file or 'built-in defaults'})")
    for column in ("name", "family", "split depth", "width", "quantization", "backends", "threshold"):
        tier_table.add_column(column)
    for tier in tiers.tiers:
        tier_table.add_row(
            tier.name,
            tier.family,
            str(tier.split_depth),
            f"{tier.width:g}",
            ", ".join(tier.quantization),
            ", ".join(tier.backends),
            "calibrated" if tier.threshold is None else f"{tier.threshold:g}",
        )
    console.print(tier_table)
    _print_datasets(data_root)


def _tiers_or_fail(tiers_file: Path | None):
    from pydantic import ValidationError

    from harmony_mobile.models import load_tiers
    from harmony_mobile.yaml_files import YamlFileError

    try:
        return load_tiers(tiers_file)
    except YamlFileError as error:
        fail(str(error))
    except ValidationError as error:
        fail(invalid(f"tiers file {tiers_file}", error))


def _print_datasets(data_root: Path | None) -> None:
    from importlib.util import find_spec

    if find_spec("torch") is None:  # the data sets load into torch tensors; a slim server has none
        console.print("datasets: listed with the train extra (pip install 'harmony-mobile\\[train]')")
        return
    from harmony_mobile.data import DATASETS, find_available

    data_table = Table(title=f"datasets (data root: {data_root or 'none'})")
    data_table.add_column("name")
    data_table.add_column("available")
    data_table.add_column("what")
    available = find_available(data_root)
    for name, description in DATASETS.items():
        data_table.add_row(name, "yes" if available[name] else "no", description)
    console.print(data_table)


def reflowed(doc: str) -> str:
    """A docstring as Typer's rich help should get it: each prose paragraph on one line, so the
    terminal wraps it at its own width (Typer keeps a docstring's line breaks inside a paragraph,
    which at 80 columns breaks lines mid-sentence). Paragraphs with indented lines stay as written."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(
        p if any(line[:1].isspace() for line in p.splitlines()) else " ".join(p.split("\n"))
        for p in paragraphs
    )


def reflow_command_help(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = reflowed(doc)
    for group in typer_app.registered_groups:
        reflow_command_help(group.typer_instance)


reflow_command_help(app)

if __name__ == "__main__":
    app()
