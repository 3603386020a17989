import plait


def test_version_is_exposed() -> None:
    assert plait.__version__.count(".") == 2
