"""``postjob web``: the dashboard on its own server."""

from __future__ import annotations

import click

from postjob_sa.errors import InvalidArgument

from ._env import App

TOKEN_VARIABLE = "POSTJOB_WEB_TOKEN"


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8008, show_default=True, help="Port to listen on (0: any free one).")
@click.option("--token", envvar=TOKEN_VARIABLE, metavar="SECRET",
              help=f"The secret that unlocks actions (default ${TOKEN_VARIABLE}); without it the "
              "dashboard is read-only.")
@click.option("--read-only", is_flag=True, help="No actions, even with a token.")
@click.option("--refresh", type=float, default=2.0, show_default=True,
              help="Seconds between live updates of a page (0: none).")
@click.pass_obj
def web(app: App, host: str, port: int, token: str | None, read_only: bool, refresh: float) -> None:
    """Serve the dashboard: queues, jobs, job trees, and the operator's actions."""
    try:
        from postjob_sa.web import create_app
        from postjob_sa.web.server import server
    except ImportError as exc:
        raise InvalidArgument(str(exc)) from None
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"--port must be from 0 to 65535, not {port}")
    with app.connect_checked():
        pass
    dashboard = create_app(app.engine, token=token, read_only=read_only or not token, refresh=refresh)
    httpd = server(dashboard, host, port)
    address = f"http://{host if ':' not in host else '[' + host + ']'}:{httpd.server_port}/"
    click.echo(f"postjob web: {app.display_url()} on {address}")
    if read_only:
        click.echo("read-only: actions are off (--read-only)")
    elif not token:
        click.echo(f"read-only: actions (reset, force, resolve) need a secret: --token or ${TOKEN_VARIABLE}")
    else:
        click.echo(f"actions (reset, force, resolve) need the token: log in at {address}login")
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
