"""The shared config checks: refusals name the component, key, value and what is supported."""

import re
import warnings

import pytest

from sdxl_tpu.models.unet import UNetConfig
from sdxl_tpu.models.vae import VAEConfig
from sdxl_tpu.request.configs import check_supported, warn_unknown

SUPPORTED = {"prediction_type": ("epsilon",), "use_karras_sigmas": (False, None)}


def test_refused_value_names_key_value_and_supported():
    expected = "scheduler config: unsupported prediction_type='v_prediction' (supported: ('epsilon',))"
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_supported("scheduler", {"prediction_type": "v_prediction"}, SUPPORTED)
    with pytest.raises(ValueError, match=re.escape("unsupported use_karras_sigmas=True (supported: (False, None))")):
        check_supported("scheduler", {"use_karras_sigmas": True}, SUPPORTED)


def test_supported_and_missing_keys_pass():
    check_supported("scheduler", {"prediction_type": "epsilon", "use_karras_sigmas": None}, SUPPORTED)
    check_supported("scheduler", {}, SUPPORTED)
    check_supported("scheduler", {"beta_schedule": "anything"}, SUPPORTED)  # keys not listed are not checked


def test_warn_unknown_skips_known_and_private_keys():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unknown("unet", {"_class_name": "UNet2DConditionModel", "in_channels": 4}, {"in_channels"})
    with pytest.warns(UserWarning, match=re.escape("unet config: ignoring unknown keys ['a', 'b']")):
        warn_unknown("unet", {"b": 1, "a": 2, "in_channels": 4}, {"in_channels"})


@pytest.mark.parametrize("from_dict, component", [(UNetConfig.from_dict, "unet"), (VAEConfig.from_dict, "vae")])
def test_components_use_the_shared_message(from_dict, component):
    expected = f"{component} config: unsupported act_fn='gelu' (supported: ('silu',))"
    with pytest.raises(ValueError, match=re.escape(expected)):
        from_dict({"act_fn": "gelu", "block_out_channels": [32]})
