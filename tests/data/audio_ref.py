"""Generates tests/data/audio_ref.wav and tests/data/audio_ref.lua, the reference features that
tests/lua/test_audio.lua compares rl.audio.features against (run once; the outputs are stored).

    build/torch-venv/bin/python tests/data/audio_ref.py     (bench/torch_env.sh makes the venv,
                                                             plus pip install --no-deps torchaudio)

The waveform: 0.6 s at 16 kHz of a synthetic vowel-like signal (a glide of pitch with harmonics
shaped by three formant resonances, plus a little noise), stored as 16-bit PCM WAV.
Log-mel references come from torchaudio.compliance.kaldi.fbank (Kaldi's algorithm) on the
samples read back from the WAV. torchaudio's Linux wheels stop at 2.11, whose compiled
extension refuses torch 2.15, so kaldi.py (pure Python over torch) is loaded on its own with a
stand-in `torchaudio` module whose only member, functional.create_dct, is the orthonormal DCT-II
(torchaudio's create_dct(n, n, "ortho"), written out below; only mfcc uses it). Deltas
(torchaudio.functional.compute_deltas' formula, edges repeated) and the per-utterance
mean/variance normalisation are computed here in float64 NumPy.
"""
import importlib.util
import math
import os
import sys
import types
import wave

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
rate = 16000


def create_dct(n_mfcc, n_mels, norm):
    assert norm == "ortho"
    n = torch.arange(float(n_mels))
    k = torch.arange(float(n_mfcc)).unsqueeze(1)
    dct = torch.cos(math.pi / float(n_mels) * (n + 0.5) * k)
    dct[0] *= 1.0 / math.sqrt(2.0)
    dct *= math.sqrt(2.0 / float(n_mels))
    return dct.t()


def load_kaldi():
    import site
    for d in site.getsitepackages():
        path = os.path.join(d, "torchaudio", "compliance", "kaldi.py")
        if os.path.exists(path):
            break
    stub = types.ModuleType("torchaudio")
    stub.functional = types.SimpleNamespace(create_dct=create_dct)
    sys.modules["torchaudio"] = stub
    spec = importlib.util.spec_from_file_location("kaldi_ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_wave():
    rng = np.random.default_rng(15)
    n = int(0.6 * rate)
    t = np.arange(n) / rate
    f0 = 110 + 60 * t / t[-1]                       # pitch glide 110 -> 170 Hz
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = np.zeros(n)
    for h in range(1, 40):
        fh = h * f0
        amp = sum(1.0 / (1 + ((fh - fc) / bw) ** 2) for fc, bw in ((700, 130), (1220, 160), (2600, 250)))
        x += amp * np.sin(h * phase) * (fh < rate / 2)
    x = 0.5 * x / np.abs(x).max() + 0.01 * rng.standard_normal(n)
    x *= np.minimum(1, np.minimum(t, t[-1] - t) / 0.05)  # 50 ms fades
    return np.round(np.clip(x, -1, 1) * 32767).astype(np.int16)


def deltas(c, n=2):
    t_n = c.shape[0]
    den = 2 * sum(k * k for k in range(1, n + 1))
    d = np.zeros_like(c)
    for t in range(t_n):
        for k in range(1, n + 1):
            d[t] += k * (c[min(t + k, t_n - 1)] - c[max(t - k, 0)])
    return d / den


def normalize(x):
    return (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-10)


def lua_matrix(name, m):
    rows = ",\n".join("  {" + ",".join("%.7g" % v for v in r) + "}" for r in m)
    return "%s = {\n%s},\n" % (name, rows)


def main():
    pcm = make_wave()
    wav = os.path.join(here, "audio_ref.wav")
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    # what libsndfile returns for 16-bit PCM: sample / 32768
    x = torch.from_numpy(pcm.astype(np.float32) / 32768.0).unsqueeze(0)
    K = load_kaldi()
    fb = K.fbank(x, num_mel_bins=80, sample_frequency=rate, dither=0.0).double().numpy()
    fb_ham = K.fbank(x, num_mel_bins=40, sample_frequency=rate, dither=0.0, window_type="hamming",
                     frame_length=20.0, frame_shift=12.5, preemphasis_coefficient=0.0,
                     low_freq=100.0, high_freq=-400.0).double().numpy()
    fb_hann_mag = K.fbank(x, num_mel_bins=24, sample_frequency=rate, dither=0.0, window_type="hanning",
                          use_power=False, remove_dc_offset=False).double().numpy()
    # Kaldi's snip_edges = false: frames centred on the hops, the edges reflected; the short
    # waveform (500 samples, 3 frames) has frames reaching over both ends
    fb_nosnip = K.fbank(x, num_mel_bins=80, sample_frequency=rate, dither=0.0,
                        snip_edges=False).double().numpy()
    fb_ham_nosnip = K.fbank(x, num_mel_bins=40, sample_frequency=rate, dither=0.0,
                            window_type="hamming", frame_length=20.0, frame_shift=12.5,
                            snip_edges=False).double().numpy()
    fb_short_nosnip = K.fbank(x[:, :500], num_mel_bins=80, sample_frequency=rate, dither=0.0,
                              snip_edges=False).double().numpy()
    mf = K.mfcc(x, num_mel_bins=23, num_ceps=13, sample_frequency=rate, dither=0.0).double().numpy()
    d1 = deltas(mf)
    mf_d = normalize(np.concatenate([mf, d1, deltas(d1)], 1))
    with open(os.path.join(here, "audio_ref.lua"), "w") as f:
        f.write("-- generated by tests/data/audio_ref.py (torchaudio.compliance.kaldi, torch %s)\n"
                % torch.__version__)
        f.write("return {\n")
        f.write(lua_matrix("fbank80_povey", fb))
        f.write(lua_matrix("fbank40_hamming", fb_ham))
        f.write(lua_matrix("fbank24_hann_magnitude", fb_hann_mag))
        f.write(lua_matrix("mfcc13_deltas_cmvn", mf_d))
        f.write(lua_matrix("fbank80_povey_nosnip", fb_nosnip))
        f.write(lua_matrix("fbank40_hamming_nosnip", fb_ham_nosnip))
        f.write(lua_matrix("fbank80_short_nosnip", fb_short_nosnip))
        f.write("}\n")
    print("wrote", wav, "and audio_ref.lua:", fb.shape, fb_ham.shape, fb_hann_mag.shape, mf_d.shape,
          fb_nosnip.shape, fb_ham_nosnip.shape, fb_short_nosnip.shape)


if __name__ == "__main__":
    main()
