"""torchaudio's side of bench/audio.lua: one measurement of Kaldi fbank on the CPU.

    python torch_audio.py SECONDS_OF_AUDIO N_MELS REPS

builds the same waveform as bench/audio.lua (16 kHz, x_i = 0.3 sin(0.0863 i) + 0.2 sin(0.5403 i)
sin(0.00071 i) + 0.05 sin(2.7 i)), warms up once, then times REPS calls of
torchaudio.compliance.kaldi.fbank (num_mel_bins N_MELS, dither 0, other options Kaldi's
defaults) on 1 thread and prints "seconds_per_call mean_of_features". kaldi.py is loaded as
tests/data/audio_ref.py loads it (torchaudio 2.11's compiled extension refuses torch 2.15).
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
from audio_ref import load_kaldi  # noqa: E402


def main():
    secs, n_mels, reps = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    i = torch.arange(int(secs * 16000), dtype=torch.float64)
    x = (0.3 * torch.sin(0.0863 * i) + 0.2 * torch.sin(0.5403 * i) * torch.sin(0.00071 * i)
         + 0.05 * torch.sin(2.7 * i)).float().unsqueeze(0)
    K = load_kaldi()

    def run():
        return K.fbank(x, num_mel_bins=n_mels, sample_frequency=16000.0, dither=0.0)

    f = run()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    dt = (time.perf_counter() - t0) / reps
    print(f"{dt:.9f} {float(f.double().mean()):.9g}")


if __name__ == "__main__":
    main()
