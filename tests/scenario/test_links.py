"""One declaration per link property, one inheritance rule."""
import inspect

from testbed.scenario.links import LINK_PROPERTIES, BothDirections, Direction, inherit
from testbed.scenario.schema import Event, LinkShape, Profile


def test_the_most_specific_layer_that_sets_a_property_wins():
    event = Direction(rate=1e6)
    pair = Direction(latency=0.05)
    profile = Direction(rate=5e6, latency=0.01, jitter=0.002)
    lan = Direction(rate=1e9, loss=0.01)
    assert inherit(event, pair, profile, lan) == Direction(rate=1e6, latency=0.05, jitter=0.002, loss=0.01)
    assert inherit(None, lan) == lan and inherit() == Direction()


def test_every_link_model_uses_the_one_declaration():
    assert LINK_PROPERTIES == ("rate", "latency", "jitter", "loss")
    shared = set(BothDirections.model_fields)
    assert shared == {"bandwidth", *LINK_PROPERTIES} - {"rate"}
    for model in (Profile, LinkShape):
        assert shared <= set(model.model_fields) and issubclass(model, BothDirections)
    assert set(LINK_PROPERTIES) <= set(Event.model_fields) and issubclass(Event, Direction)


def test_profiles_and_wan_links_resolve_with_the_same_rule():
    p = Profile(bandwidth="10mbit", latency="20ms", uplink={"rate": "2mbit"})
    assert p.resolved_direction("uplink") == Direction(rate=2e6, latency=0.02)
    assert p.resolved_direction("downlink") == Direction(rate=10e6, latency=0.02)
    wan_default = LinkShape(bandwidth="100mbit", loss="1%")
    link = LinkShape(latency="30ms", reverse={"rate": "5mbit"})
    assert link.resolved("forward", wan_default) == Direction(rate=100e6, latency=0.03, loss=0.01)
    assert link.resolved("reverse", wan_default) == Direction(rate=5e6, latency=0.03, loss=0.01)


def test_a_link_event_changes_what_it_sets_and_nothing_else():
    ev = Event(at=0, target="w0", action="link", latency="5ms")
    assert ev.change_fields() == {"direction": "both", "latency": 0.005}
    now = Direction(rate=1e6, latency=0.1, loss=0.02)
    assert inherit(Direction(**ev.set_properties()), now) == Direction(rate=1e6, latency=0.005, loss=0.02)


def test_edgebed_link_offers_every_property():
    from testbed.cli import link

    assert set(LINK_PROPERTIES) <= set(inspect.signature(link).parameters)
