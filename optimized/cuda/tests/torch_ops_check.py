"""The CUDA dispatch of dsa::topk_indices (SPEC §3), dsa::indexer_scores (+ backward, SPEC
§2, integer grids: bit-exact against the same op on CPU tensors), dsa::sparse_mla_fwd (SPEC
§4, §6, an exact grid: rows of one repeated id and empty rows equal the op on CPU tensors
bit for bit) and dsa::sparse_mla_bwd (§5: a CUDA kernel, the composite's dtypes, finite,
deterministic) from Python, run on the GPU machine by
ci/gpu/test.sh: loads libdsa_torch_ops.so with torch.ops.load_library, checks that the op has
a CUDA kernel, that on CUDA tensors it returns the composite's answer (the same op on CPU
tensors: bytes when sorted, sets when unsorted) for random and plateau rows, windows, both
tie policies, and that sorted small ids on random rows equal torch.topk's. Then times it
against torch.topk on [128, 131072], k 2048 (CUDA events, median of 20, one input).
Usage: python3 torch_ops_check.py path/to/libdsa_torch_ops.so; exit 1 on any mismatch."""
import sys

import torch


def main() -> int:
    torch.ops.load_library(sys.argv[1])
    op = torch.ops.dsa.topk_indices
    assert torch._C._dispatch_has_kernel_for_dispatch_key("dsa::topk_indices", "CUDA")
    torch.manual_seed(0)
    cases = fails = 0
    for s_q, s_kv in [(3, 1000), (2, 40001), (4, 131072)]:
        for fill in ("randn", "plateau"):
            if fill == "randn":
                x = torch.randn(s_q, s_kv, device="cuda")
            else:
                x = torch.randint(0, 4, (s_q, s_kv), device="cuda").float()
            for k in (1, 300, 2048):
                for tb in ("small", "large"):
                    for srt in (True, False):
                        for win in (False, True):
                            ks = ke = None
                            if win:
                                ks = torch.arange(s_q, device="cuda") * (s_kv // (2 * s_q))
                                ke = ks + s_kv // 2
                            got = op(x, k, ks, ke, tb, srt)
                            ref = op(x.cpu(), k, None if ks is None else ks.cpu(),
                                     None if ke is None else ke.cpu(), tb, srt)
                            assert got.is_cuda and got.dtype == torch.int32
                            g = got.cpu()
                            ok = torch.equal(g, ref) if srt else torch.equal(
                                g.sort(1).values, ref.sort(1).values)
                            cases += 1
                            if not ok:
                                fails += 1
                                print(f"MISMATCH s_kv={s_kv} fill={fill} k={k} tie={tb} "
                                      f"sorted={srt} windows={win}")
    # dsa::indexer_scores (+ backward, SPEC §2) on integer grids: every product and sum is exact,
    # so the CUDA kernels equal the composite on CPU tensors bit for bit (windows, d_I padded).
    iop, ibw = torch.ops.dsa.indexer_scores, torch.ops.dsa.indexer_scores_backward
    for name in ("dsa::indexer_scores", "dsa::indexer_scores_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")
    for s_q, s_kv, h, d, win in [(9, 700, 64, 128, True), (5, 130, 37, 24, False)]:
        q = torch.randint(-3, 4, (s_q, h, d)).to(torch.bfloat16)
        kk = torch.randint(-3, 4, (s_kv, d)).to(torch.bfloat16)
        w = torch.randint(-2, 3, (s_q, h)).float()
        ds = torch.randint(-2, 3, (s_q, s_kv)).float()
        ks = ke = None
        if win:
            ks = torch.randint(0, s_kv // 2, (s_q,))
            ke = ks + torch.randint(-3, s_kv, (s_q,))
        cu = lambda t: None if t is None else t.cuda()
        got = iop(q.cuda(), kk.cuda(), w.cuda(), cu(ks), cu(ke))
        ref = iop(q, kk, w, ks, ke)
        gb = ibw(q.cuda(), kk.cuda(), w.cuda(), ds.cuda(), cu(ks), cu(ke))
        rb = ibw(q, kk, w, ds, ks, ke)
        cases += 1
        if not (got.is_cuda and torch.equal(got.cpu(), ref) and torch.isfinite(ref).any()
                and all(torch.equal(a.cpu(), b) for a, b in zip(gb, rb))):
            fails += 1
            print(f"MISMATCH indexer s_q={s_q} s_kv={s_kv} H_I={h} d_I={d} windows={win}")
    # dsa::sparse_mla_fwd (SPEC §4, §6) on an exact grid: q and kv integers in [-3, 3] (exact in
    # bf16, every dot product exact in fp32), sm_scale 1/8. A row whose valid slots all hold one
    # id (once, or repeated) has p = 1 on each slot, so out = kv[id, :d_v] and max_logits =
    # q.kv / 8 exactly on every route, and with one slot lse = max_logits; rows without a valid
    # slot give 0 / +inf / -inf. The CUDA kernel must equal the composite on CPU tensors there
    # (lse of the repeated-id row, m + ln 100, is left out: two logs may round differently).
    mop = torch.ops.dsa.sparse_mla_fwd
    assert torch._C._dispatch_has_kernel_for_dispatch_key("dsa::sparse_mla_fwd", "CUDA")
    s_q, h_q, d_qk, d_v, s_kv, k = 6, 128, 576, 512, 300, 150
    q = torch.randint(-3, 4, (s_q, h_q, d_qk)).to(torch.bfloat16)
    kvm = torch.randint(-3, 4, (s_kv, d_qk)).to(torch.bfloat16)
    idx = torch.full((s_q, k), -1, dtype=torch.int32)
    idx[0, 5] = 17  # one valid slot
    idx[1, 70] = 250  # one valid slot, in the second tile of 64 (the first fully masked)
    idx[2, :] = 33  # one id 100 times, holes of out-of-range ids
    idx[2, ::3] = s_kv
    idx[4, 100] = 3  # row 3 all -1; row 4's one valid id lies past its topk_length
    idx[5, :] = -5
    length = torch.tensor([150, 150, 150, 150, 90, 150], dtype=torch.int32)
    got = mop(q.cuda(), kvm.cuda(), idx.cuda(), 0.125, d_v, length.cuda(), None)
    ref = mop(q, kvm, idx, 0.125, d_v, length, None)
    rows = [0, 1, 3, 4, 5]
    cases += 1
    checks = {
        "cuda bf16 out": got[0].is_cuda and got[0].dtype == torch.bfloat16,
        "out": torch.equal(got[0].cpu(), ref[0]),
        "max_logits": torch.equal(got[2].cpu(), ref[2]),
        "lse of rows 0, 1, 3-5": torch.equal(got[1].cpu()[rows], ref[1][rows]),
        "composite row 0 = kv[17]": torch.equal(ref[0][0], kvm[17, :d_v].expand(h_q, d_v)),
        "composite row 2 = kv[33]": torch.equal(ref[0][2], kvm[33, :d_v].expand(h_q, d_v)),
        "empty rows": bool(torch.isposinf(ref[1][3:]).all()) and bool(torch.isneginf(ref[2][3:]).all())
        and not bool(ref[0][3:].any()),
    }
    if not all(checks.values()):
        fails += 1
        print("MISMATCH sparse_mla_fwd on the exact grid (one id per row, empty rows): "
              + ", ".join(k for k, v in checks.items() if not v))
    # dsa::sparse_mla_bwd (SPEC §5) has a CUDA kernel (the deterministic backward): on CUDA
    # tensors it returns finite grads of the composite's dtypes, bitwise equal run to run.
    bop = torch.ops.dsa.sparse_mla_bwd
    assert torch._C._dispatch_has_kernel_for_dispatch_key("dsa::sparse_mla_bwd", "CUDA")
    qc, kvc, ic, lc = q.cuda(), kvm.cuda(), idx.cuda(), length.cuda()
    dout = torch.randn(s_q, h_q, d_v, device="cuda")
    b1 = bop(qc, kvc, ic, got[0], got[1], dout, 0.125, d_v, lc, None)
    b2 = bop(qc, kvc, ic, got[0], got[1], dout, 0.125, d_v, lc, None)
    rb = bop(q, kvm, idx, ref[0], ref[1], dout.cpu(), 0.125, d_v, length, None)
    cases += 1
    if not (all(a.is_cuda and a.dtype == r.dtype and bool(torch.isfinite(a).all())
                for a, r in zip(b1[:2], rb[:2]))
            and all(torch.equal(a, b) for a, b in zip(b1, b2)) and bool(b1[1].abs().sum() > 0)):
        fails += 1
        print("MISMATCH sparse_mla_bwd on CUDA (dtypes, finite, run to run)")
    x = torch.randn(128, 131072, device="cuda")
    ids = op(x, 2048, None, None, "small", True)
    peer = torch.topk(x, 2048, dim=1, largest=True, sorted=True).indices
    cases += 1
    if not torch.equal(ids.long(), peer):
        fails += 1
        print("MISMATCH vs torch.topk on [128, 131072]")

    def median_ms(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[len(times) // 2]

    t_ours = median_ms(lambda: op(x, 2048, None, None, "small", True))
    t_peer = median_ms(lambda: torch.topk(x, 2048, dim=1, sorted=True))
    print(f"torch_ops_check: {cases} cases, {fails} mismatches; [128, 131072] k 2048 sorted: "
          f"torch.ops.dsa.topk_indices {t_ours:.4f} ms, torch.topk {t_peer:.4f} ms "
          f"(single calls with launch latency, one input, L2-warm: a smoke figure, not the "
          f"benchmark)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
