from solution import add


def test_small_numbers():
    assert add(2, 2) == 4


def test_negative_numbers():
    assert add(-3, 1) == -2
