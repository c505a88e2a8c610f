"""The root ``pdscale`` command: assembles the sub-commands each layer defines.

It lives in ``training`` because that is the one layer allowed to import every other. Sub-apps import
their heavy dependencies (torch, lightning, optuna, matplotlib) inside the command functions, so
``pdscale --help`` stays fast and the controller starts without torch.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="pdscale",
    help=(
        "Predictive autoscaler for prefill/decode-disaggregated LLM serving.\n\n"
        "Forecasts each node's load over the next 5 s and sets prefill, decode and warm-standby "
        "capacity ahead of bursts.\n\n"
        "Example: pdscale trace stats datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
)

# Sub-apps, one line each (keep this list sorted by command name).
import controller.replay_policies  # noqa: E402, F401  (registers reactive, dynamo-like, predictive, oracle)
from controller.cli import config_app, controller_cmd  # noqa: E402
from controller.doctor_cli import doctor_cmd  # noqa: E402
from serving.manifests.cli import manifests_cmd  # noqa: E402
from serving.pools.cli import pool_app  # noqa: E402
from serving.router.cli import router_cmd  # noqa: E402
from serving.sim.cli import sim_app  # noqa: E402
from serving.sim.plan_cli import plan_cmd  # noqa: E402
from serving.sim.replay_cli import replay_cmd  # noqa: E402
from serving.workload.cli import trace_app  # noqa: E402
from training.bench_cli import bench_app  # noqa: E402
from training.tune_cli import tune_cmd  # noqa: E402

app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")
app.command("controller")(controller_cmd)
app.command("doctor")(doctor_cmd)
app.command("manifests")(manifests_cmd)
app.command("plan")(plan_cmd)
app.add_typer(pool_app, name="pool")
app.command("replay")(replay_cmd)
app.command("router")(router_cmd)
app.add_typer(sim_app, name="sim")
app.add_typer(trace_app, name="trace")
app.command("tune")(tune_cmd)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
