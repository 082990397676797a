"""Reading a `torch.save` weights file a profile field names, without running code from it.

`torch.load(weights_only=True)` refuses a pickle that names anything but tensors and plain values, which is
what we want; its error, though, is a page that ends by advising to retry with `weights_only=False` (what
would run the planted code) and names no profile field. Here it is one line naming the field."""

from __future__ import annotations

import os
import pickle
from typing import Any

from vidforge.errors import UserInputError


def load_torch_weights(path: str | os.PathLike, field: str) -> Any:
    """The state dict (or whatever plain data) in `path`, loaded on the CPU with weights_only=True; a file
    that is not such data is a UserInputError naming `field`."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message: a paragraph, then "WeightsUnpickler error:", then what it met, then a link.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        what = next((line for line in lines[1:] if "unsupported" in line.lower()), "")
        if "global" in what.lower():  # a pickle naming a function or class: code, not weights
            raise UserInputError(
                f"{field}: {path} holds more than weights ({what[:200]}); vidforge loads weights without "
                "running code from them: give the published weights file"
            ) from None
        raise UserInputError(f"{field}: {path} is not a torch weights file ({what[:200]})") from None
    except (RuntimeError, EOFError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserInputError(f"{field}: {path} is not a torch weights file ({first[:200]})") from None
