"""flashlight-text's side of bench/ctc_lm.lua: CTC beam search with a KenLM n-gram LM, built as
torchaudio's models.decoder.ctc_decoder builds it without a lexicon (LexiconFreeDecoder, CTC
criterion, beam_size_token = all tokens, beam_threshold 50, log_add False: torchaudio's
defaults), on log-probabilities written by the Lua side.

    python flashlight_ctc.py DIR BEAM LM_WEIGHT REPS

DIR holds tokens.txt (one token a line, the blank last), lengths.txt (T of each sequence),
logp.f32 (each sequence's (T, V) float32 rows one after another) and lm.arpa. Decodes every
sequence once to warm up, then REPS times, timing only the decode calls (one thread), and prints
"seconds_per_pass" then one line of labels (0-based, blanks and repeats removed, the silence
token <sp> the path starts and ends with dropped) per sequence.
"""
import itertools
import sys
import time

import numpy as np
from flashlight.lib.text.decoder import (CriterionType, KenLM, LexiconFreeDecoder,
                                         LexiconFreeDecoderOptions)
from flashlight.lib.text.dictionary import Dictionary


def main():
    d, beam, weight, reps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    tokens = open(d + "/tokens.txt").read().split("\n")[:-1]
    lengths = [int(x) for x in open(d + "/lengths.txt").read().split()]
    V = len(tokens)
    logp = np.fromfile(d + "/logp.f32", dtype=np.float32)
    offs = np.cumsum([0] + [t * V for t in lengths])
    seqs = [np.ascontiguousarray(logp[offs[i]:offs[i + 1]]) for i in range(len(lengths))]
    lm = KenLM(d + "/lm.arpa", Dictionary(tokens))
    blank, sil = V - 1, tokens.index("<sp>")
    opts = LexiconFreeDecoderOptions(beam_size=beam, beam_size_token=V, beam_threshold=50.0,
                                     lm_weight=weight, sil_score=0.0, log_add=False,
                                     criterion_type=CriterionType.CTC)
    decoder = LexiconFreeDecoder(opts, lm, sil, blank, [])

    def run():
        out = []
        for x, t in zip(seqs, lengths):
            r = decoder.decode(x.ctypes.data, t, V)[0]
            ids = (g[0] for g in itertools.groupby(r.tokens))
            ids = [i for i in ids if i >= 0 and i != blank]
            # the decoder's path starts and ends in the silence token (as torchaudio's tokens do)
            if ids and ids[0] == sil:
                ids = ids[1:]
            if ids and ids[-1] == sil:
                ids = ids[:-1]
            out.append(ids)
        return out

    hyps = run()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    print((time.perf_counter() - t0) / reps)
    for h in hyps:
        print(" ".join(str(i) for i in h))


if __name__ == "__main__":
    main()
