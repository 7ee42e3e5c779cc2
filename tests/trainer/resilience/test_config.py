"""The resilience block must load through the trainer's one config loader."""

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import build
from ftfleet.trainer.resilience import ResilienceConfig


def load(raw):
    return build(ResilienceConfig, raw, prefix="resilience.")


def test_an_empty_block_gives_the_defaults():
    assert load({}) == ResilienceConfig()
    assert ResilienceConfig().watcher.signals == ["SIGTERM"]


def test_yaml_sections_reach_their_building_blocks():
    config = load(
        {
            "watcher": {"poll_interval_s": 1, "signals": ["SIGTERM", "SIGUSR1"], "signal_grace_s": None},
            "anomaly": {"policy": "rollback", "spike_factor": "4"},
            "watchdog": {"timeout_s": 120, "first_step_timeout_s": 900},
            "interval": {"mode": "fixed", "fixed_steps": 50, "mtbf_s": 7200},
        }
    )
    assert config.watcher.signals == ["SIGTERM", "SIGUSR1"]
    assert config.watcher.poll_interval_s == 1.0
    assert (config.anomaly.policy, config.anomaly.spike_factor) == ("rollback", 4.0)
    assert (config.watchdog.timeout_s, config.watchdog.first_step_timeout_s) == (120, 900)
    assert (config.interval.mode, config.interval.fixed_steps) == ("fixed", 50)


def test_an_unknown_setting_is_named_with_its_path():
    with pytest.raises(ConfigError, match=r"resilience\.anomaly\.polcy.*policy"):
        load({"anomaly": {"polcy": "skip"}})


def test_an_invalid_value_is_refused_with_the_key_where_it_is_nested():
    with pytest.raises(ConfigError, match=r"resilience\.anomaly\.policy='retry'"):
        load({"anomaly": {"policy": "retry"}})
    with pytest.raises(ConfigError, match=r"resilience\.watchdog\.timeout_s=-1"):
        load({"watchdog": {"timeout_s": -1}})
