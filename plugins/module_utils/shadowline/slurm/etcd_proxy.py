"""A Slurm job's etcd proxy: ``python -m shadowline.slurm.etcd_proxy --ca CA --cert PEM --route PORT=HOST@ADDR:PORT``.

Dynamo 1.6.1's etcd client has no TLS, and a job's etcd takes only TLS with a client certificate of the job's CA
(as a playbook deployment's does). A playbook deployment runs HAProxy on every host for Dynamo's processes
(deployment/plan_builder.py ``_etcd_proxy``); a job's nodes may have no HAProxy, and a job cannot install one, but every
node has the runtime's Python (the watchdog runs there). So a job runs this instead, one task per node for the
whole job: it accepts plain connections on 127.0.0.1 only, a port per etcd member (the plan's routes, the same
as HAProxy's), and carries each to its member over TLS, presenting the node's client certificate (``--cert``:
certificate and key in one file) and checking the member's against the job's CA and the member's host name.
It offers ALPN ``h2``, as HAProxy does: etcd's Go server speaks gRPC over TLS only to a client that offers it.
etcd's passwords still apply: a local process without one reads and writes nothing.

Stdlib only (asyncio and ssl), so that it runs from the runtime's interpreter on any node. It logs one line per
connection that could not reach its member, and ends on SIGTERM or SIGINT (Slurm's end of the step).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from dataclasses import dataclass

from ..common.console import err

CONNECT_TIMEOUT_S = 2.0  # HAProxy's "timeout connect" in the playbook deployment's proxy
CHUNK = 65536


@dataclass(frozen=True)
class Route:
    port: int  # on 127.0.0.1
    name: str  # the member's host name: its certificate must name it
    address: str
    member_port: int

    @classmethod
    def parse(cls, text: str) -> Route:
        """``PORT=NAME@ADDRESS:PORT`` (an IPv6 address in brackets), as the plan renders it."""
        try:
            listen, target = text.split("=", 1)
            name, member = target.split("@", 1)
            address, port = member.rsplit(":", 1)
            route = cls(int(listen), name, address.strip("[]"), int(port))
        except ValueError:
            raise ValueError(f"--route {text!r}: expected PORT=NAME@ADDRESS:PORT") from None
        if not (0 < route.port < 65536 and 0 < route.member_port < 65536) or not name or not route.address:
            raise ValueError(f"--route {text!r}: expected PORT=NAME@ADDRESS:PORT with ports 1-65535")
        return route


def member_context(ca: str, cert: str) -> ssl.SSLContext:
    """TLS to a member: the job's CA, the node's client certificate (and key, ``cert`` holds both), ALPN h2."""
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert)
    context.set_alpn_protocols(["h2"])
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass  # the other side went away: both directions end
    finally:
        writer.close()


async def _carry(route: Route, context: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    try:
        member_reader, member_writer = await asyncio.wait_for(
            asyncio.open_connection(route.address, route.member_port, ssl=context, server_hostname=route.name),
            CONNECT_TIMEOUT_S)
    except (OSError, ssl.SSLError, asyncio.TimeoutError) as error:
        err(f"etcd proxy: 127.0.0.1:{route.port} -> {route.name} ({route.address}:{route.member_port}): "
            f"{error!r}")
        writer.close()
        return
    await asyncio.gather(_pipe(reader, member_writer), _pipe(member_reader, writer))


async def serve(routes: list[Route], context: ssl.SSLContext, stop: asyncio.Event) -> None:
    """Listen on every route's port until ``stop`` is set."""
    servers = []
    for route in routes:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route = route) -> None:
            await _carry(route, context, reader, writer)

        servers.append(await asyncio.start_server(handle, "127.0.0.1", route.port))
    try:
        await stop.wait()
    finally:
        for server in servers:
            server.close()


async def _main(routes: list[Route], context: ssl.SSLContext) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(routes, context, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowline.slurm.etcd_proxy",
                                     description="A Slurm job's etcd proxy (Dynamo's etcd client on loopback, "
                                                 "TLS to each etcd member).")
    parser.add_argument("--ca", required=True, help="the job's CA certificate")
    parser.add_argument("--cert", required=True, help="this node's client certificate and its key, in one file")
    parser.add_argument("--route", action="append", required=True, help="PORT=NAME@ADDRESS:PORT, one per member")
    args = parser.parse_args(argv)
    try:
        routes = [Route.parse(text) for text in args.route]
        context = member_context(args.ca, args.cert)
    except (ValueError, OSError, ssl.SSLError) as error:
        err(f"etcd proxy: {error}")
        return 2
    asyncio.run(_main(routes, context))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
