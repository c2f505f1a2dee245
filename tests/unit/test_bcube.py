import math

import pytest

from bmlmpi.topology.bcube import BCube, default_shape, parse_shape, resolve_shape


@pytest.mark.parametrize("n,shape", [(1, ()), (2, (2,)), (7, (7,)), (8, (2, 2, 2)),
                                     (9, (3, 3)), (12, (2, 2, 3)), (64, (2,) * 6),
                                     (45, (3, 3, 5))])
def test_default_shape(n, shape):
    assert default_shape(n) == shape


def test_default_shape_multiplies_out():
    for n in range(1, 200):
        assert math.prod(default_shape(n)) == n


def test_parse_and_resolve():
    assert parse_shape("3x3") == (3, 3)
    assert parse_shape("2X2x3") == (2, 2, 3)
    assert parse_shape([4, 4]) == (4, 4)
    assert parse_shape("1x9") == (9,)
    assert resolve_shape(12, "3x2x2") == (3, 2, 2)
    with pytest.raises(ValueError, match="has 9 servers but the communicator has 8"):
        resolve_shape(8, "3x3")
    with pytest.raises(ValueError, match="bad BCube shape"):
        parse_shape("3xz")
    with pytest.raises(ValueError, match=">= 1"):
        parse_shape("0x3")


def test_env_shape(monkeypatch):
    monkeypatch.setenv("BMLMPI_BCUBE", "3x2")
    assert resolve_shape(6) == (3, 2)
    with pytest.raises(ValueError, match="BMLMPI_BCUBE"):
        resolve_shape(9)
    assert resolve_shape(6, "2x3") == (2, 3)  # explicit beats the environment


@pytest.mark.parametrize("radices", [(3, 3), (2, 3), (2, 2, 3), (4, 2), (5,)])
def test_addresses_and_groups(radices):
    cube = BCube(radices)
    seen = set()
    for r in range(cube.size):
        d = cube.digits(r)
        assert all(0 <= d[lv] < radices[lv] for lv in range(len(radices)))
        seen.add(d)
        for lv in range(cube.levels):
            g = cube.group(r, lv)
            assert len(g) == radices[lv] and r in g
            assert g[cube.digit(r, lv)] == r
            for b, m in enumerate(g):
                dm = cube.digits(m)
                assert dm[lv] == b
                assert all(dm[j] == d[j] for j in range(cube.levels) if j != lv)
                assert cube.color(m, lv) == cube.color(r, lv)
    assert len(seen) == cube.size
    # colours separate different groups
    for lv in range(cube.levels):
        groups = {}
        for r in range(cube.size):
            groups.setdefault(cube.color(r, lv), set()).add(r)
        assert all(len(g) == radices[lv] for g in groups.values())
