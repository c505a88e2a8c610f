"""``python -m serving.router --config router.yaml`` runs the router (see ``cli.router_cmd``)."""

from serving.router.cli import app

if __name__ == "__main__":  # importing the module (e.g. a package walk) must not start a server
    app(prog_name="python -m serving.router")
