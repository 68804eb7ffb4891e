"""`gearshift fleet status URL`: a fleet store read from outside, changing nothing in it."""

from __future__ import annotations

import json

import click

from gearshift.clock import WallClock
from gearshift.controller.cli import EPILOG, exits, json_option
from gearshift.controller.fleet import profiles_view
from gearshift.controller.fleetstore import Store


@click.group()
def fleet() -> None:
    """Read a fleet store (`serve --fleet URL`)."""


@fleet.command("status", epilog=EPILOG)
@click.argument("url")
@click.option("--ttl", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Seconds after its last publish that a node expires "
              "(the nodes' fleet_ttl_seconds).")
@json_option
def status(url: str, ttl: float, as_json: bool) -> None:
    """The nodes of the fleet at URL, when each last published, their learned gears side by
    side and how far they disagree (per dim, the share of the gears any member holds that
    not all hold), per profile and fleet key; expired nodes and objects left out (corrupt,
    hostile) with why. Credentials in URL are never printed."""
    with exits():
        store = Store(url)
        wall = WallClock().now()  # the store's times are wall-clock publish times
        read = store.read(wall, ttl)
    doc = {"url": store.url, "time": wall,
           "nodes": [{"node": g.node, "published_ago": round(wall - g.published, 3),
                      "entries": len(g.entries)} for g in read.generations],
           "expired": [{"node": n, "published_ago": round(wall - t, 3)} for n, t in read.expired],
           "bad": [{"node": n, "why": why} for n, why in read.bad],
           "profiles": profiles_view(read.generations, limit=1 << 10)}
    if as_json:
        click.echo(json.dumps(doc))
        return
    click.echo(f"fleet {doc['url']}: {len(read.generations)} live nodes, {len(read.expired)} "
               f"expired, {len(read.bad)} left out")
    for n in doc["nodes"]:
        click.echo(f"  {n['node']:<32} published {n['published_ago']:8.1f} s ago, "
                   f"{n['entries']} profiles")
    for n in doc["expired"]:
        click.echo(f"  {n['node']:<32} expired: published {n['published_ago']:.0f} s ago")
    for n in doc["bad"]:
        click.echo(f"  {n['node']:<32} left out: {n['why']}")
    for p in doc["profiles"]:
        click.echo(f"profile {p['profile']!r} key {p['key']}")
        for dim, by in p["gears"].items():
            click.echo(f"  dim {dim}: disagreement {p['disagreement'][dim]:.2f}")
            for member, gears in by.items():
                click.echo(f"    {member:<30} {' '.join(map(str, gears))}")
