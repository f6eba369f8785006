"""The `harmony` command.

This file is the composition root: each sub-command parses its flags and hands over to the
module that does the work (imported lazily, so `harmony --help` stays fast and `harmony info`
does not pay for executorch or coremltools).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="harmony-mobile: hybrid split federated learning on phones (train, bench, export, serve, demo).",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


def not_built_yet(command: str, issue: int) -> None:
    """Say plainly that a sub-command is not implemented yet, and fail."""
    console.print(f"[yellow]`harmony {command}` is not implemented yet (tracked in issue #{issue}).[/yellow]")
    raise typer.Exit(code=2)


@app.command()
def train() -> None:
    """Train and meta-adapt front-ends and the server back-end (HARMONY or a baseline)."""
    not_built_yet("train", 3)


@app.command()
def bench() -> None:
    """Run every method on the same partitions and write the benchmark report."""
    not_built_yet("bench", 4)


@app.command()
def export() -> None:
    """Quantize and export a run's front-ends per device tier (.pte, .mlpackage, signed manifest)."""
    not_built_yet("export", 5)


@app.command()
def serve() -> None:
    """Run the FastAPI fallback server."""
    not_built_yet("serve", 6)


@app.command()
def demo() -> None:
    """The whole product end to end on bundled data: train, export, serve, simulated phones."""
    not_built_yet("demo", 7)


@app.command()
def info(
    tiers_file: Annotated[Path | None, typer.Option("--tiers", help="tiers YAML (default: built-in)")] = None,
    data_root: Annotated[Path | None, typer.Option(help="folder with CIFAR/MNIST archives")] = None,
) -> None:
    """Print versions, device tiers and which datasets are available."""
    from importlib.metadata import PackageNotFoundError, version

    from harmony_mobile.data import DATASETS, find_available
    from harmony_mobile.models import load_tiers

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
    for tier in load_tiers(tiers_file).tiers:
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

    data_table = Table(title=f"datasets (data root: {data_root or 'none'})")
    data_table.add_column("name")
    data_table.add_column("available")
    data_table.add_column("what")
    available = find_available(data_root)
    for name, description in DATASETS.items():
        data_table.add_row(name, "yes" if available[name] else "no", description)
    console.print(data_table)


if __name__ == "__main__":
    app()
