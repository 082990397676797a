"""Issue 44 item 1: a run where no sample fits data.token_budget skipped samples for 12 minutes, deaf to
SIGTERM. Now it is refused before anything is built, and a wait for data (a packer skipping, a slow store)
is interrupted by SIGTERM, which a real signal to this process shows."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from vidforge.data.token_budget import bucket_tokens, require_token_budget
from vidforge.errors import UserInputError
from vidforge.profile import load_profile
from vidforge.train.loop import StopOnSigterm, WaitInterrupted


def test_a_budget_below_every_bucket_is_refused_before_training() -> None:
    sets = ["data.buckets=[[480,832]]", "data.frame_buckets=[49]", "model.patch=[1,2,2]"]
    profile = load_profile(
        None, [*sets, "tokenizer.spatial_compression=8", "tokenizer.temporal_compression=4"]
    )
    assert bucket_tokens(profile) == {(49, 480, 832): 13 * 30 * 52}
    with pytest.raises(UserInputError, match=r"data.token_budget=4096: no sample fits.* 20280 tokens"):
        require_token_budget(
            profile.model_copy(update={"data": profile.data.model_copy(update={"token_budget": 4096})})
        )
    require_token_budget(
        profile.model_copy(update={"data": profile.data.model_copy(update={"token_budget": 20280})})
    )


def test_sigterm_interrupts_a_wait_for_data() -> None:
    started = time.monotonic()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with StopOnSigterm() as stop, pytest.raises(WaitInterrupted), stop.waiting():
        while time.monotonic() - started < 30:  # a packer skipping sample after sample
            time.sleep(0.01)
    assert stop.signalled and time.monotonic() - started < 10
