"""The fabric drawing reads the same without colour vision (testbed.model.topology.describe):
node roles differ by marker shape in every family, in greys only, and a weathermap colours
links on a sequential colormap with no grey on it, dotting the links nobody measured."""
from __future__ import annotations

import matplotlib
import pytest

from testbed.model.topology import BUILDERS, build
from testbed.model.topology.describe import (
    UNMEASURED_LINK,
    UTILISATION_CMAP,
    draw,
    role_style,
)

GREY_TOLERANCE = 0.02  # a fill whose red, green and blue differ by more is a colour
CMAP_SAMPLES = 64


def is_grey(colour) -> bool:
    r, g, b, _ = matplotlib.colors.to_rgba(colour)
    return max(r, g, b) - min(r, g, b) <= GREY_TOLERANCE


@pytest.mark.parametrize("family", list(BUILDERS))
def test_every_role_of_a_family_has_a_shape_of_its_own_in_grey(family):
    fabric = build(family)
    roles = list(dict.fromkeys(node.role for node in fabric.nodes.values()))
    styles = [role_style(role, index) for index, role in enumerate(roles)]
    assert len({marker for marker, _ in styles}) == len(roles), dict(zip(roles, styles))
    assert all(is_grey(fill) for _, fill in styles)


def test_a_role_without_a_style_gets_a_spare_shape():
    assert role_style("gateway", 0)[0] != role_style("gateway", 1)[0]
    assert is_grey(role_style("gateway", 0)[1])


def test_the_utilisation_colours_are_never_a_nodes_grey():
    cmap = matplotlib.colormaps[UTILISATION_CMAP]
    assert not any(is_grey(cmap(i / (CMAP_SAMPLES - 1))) for i in range(CMAP_SAMPLES))
    lightness = [sum(cmap(i / (CMAP_SAMPLES - 1))[:3]) for i in range(CMAP_SAMPLES)]
    assert lightness[-1] > lightness[0]  # sequential: idle dark, full bright
    assert UNMEASURED_LINK["linestyle"] == ":"  # told apart by its dots, not its grey


def test_a_weathermap_with_unmeasured_links_is_drawn(tmp_path):
    fabric = build("spineleaf")
    utilisation = {f"{link.a}->{link.b}": 0.5 for link in fabric.links[::2]}
    path = draw(fabric, tmp_path / "w.png", utilisation=utilisation, title="t")
    assert path.read_bytes().startswith(b"\x89PNG")
