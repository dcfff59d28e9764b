"""The Python module against an independent numpy reference: the per-token recurrence of SPEC 2
in float64, written here from the formulas, not from the C++ code.

Run by CTest (label cpu) with PYTHONPATH=build/python.
"""
import importlib.util
import re
import shutil
import subprocess
import unittest

import numpy as np

import replayssm


def softplus(u):
    return np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))


class Layer:
    """Per-token recurrence, float64: S = exp(delta A) S + delta x B^T, y = S C + D x."""

    def __init__(self, shape, A_log, dt_bias, D, slots):
        H, P, N, G = shape
        self.shape = shape
        self.A = -np.exp(A_log.astype(np.float64))
        self.dt_bias = dt_bias.astype(np.float64)
        self.D = D.astype(np.float64)
        self.S = np.zeros((slots, H, P, N))

    def step(self, slot, x, B, C, dt):  # x [H, P], B/C [G, N], dt [H] -> y [H, P]
        H, P, N, G = self.shape
        g = np.arange(H) // (H // G)
        delta = softplus(dt.astype(np.float64) + self.dt_bias)
        a = np.exp(delta * self.A)
        S = self.S[slot]
        S *= a[:, None, None]
        S += (delta[:, None] * x)[:, :, None] * B[g][:, None, :]
        self.S[slot] = S
        return np.einsum("hpn,hn->hp", S, C[g].astype(np.float64)) + self.D[:, None] * x


def bf16(a):
    """Round float32 to bf16 (nearest even), as the cache stores bf16 activations."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


class Foreign:
    """An array the module sees only through DLPack, as it sees a torch or cupy tensor."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class BindingsTest(unittest.TestCase):
    shape = (8, 16, 64, 2)

    def make(self, mode, slots=3, activation="fp32"):
        rng = np.random.default_rng(5)
        H = self.shape[0]
        self.params = dict(
            A_log=rng.uniform(-1.0, 1.5, H).astype(np.float32),
            dt_bias=rng.uniform(-3.0, -1.0, H).astype(np.float32),
            D=rng.uniform(0.5, 1.5, H).astype(np.float32),
        )
        cache = replayssm.ReplayCache(self.shape, mode=mode, num_slots=slots,
                                      activation=activation, **self.params)
        ref = Layer(self.shape, slots=slots, **self.params)
        return cache, ref, rng

    def twins(self, mode, requests, activation="fp32"):
        """Two caches of the same layer with the same slots open: (a, b, slots, rng)."""
        a, _, rng = self.make(mode, activation=activation)
        b = self.make(mode, activation=activation)[0]
        slots = np.array([a.allocate(r) for r in requests], dtype=np.int32)
        for r in requests:
            b.allocate(r)
        return a, b, slots, rng

    def tokens(self, rng, batch, T):
        H, P, N, G = self.shape
        return (rng.normal(0, 1, (batch, T, H, P)).astype(np.float32),
                rng.normal(0, 0.3, (batch, T, G, N)).astype(np.float32),
                rng.normal(0, 0.3, (batch, T, G, N)).astype(np.float32),
                rng.normal(0, 1, (batch, T, H)).astype(np.float32))

    def run_decode(self, mode, activation, tol):
        cache, ref, rng = self.make(mode, activation=activation)
        slots = np.array([cache.allocate(10), cache.allocate(11)], dtype=np.int32)
        rounding = bf16 if activation == "bf16" else (lambda a: a)
        x, B, C, dt = self.tokens(rng, 2, 5)
        y = cache.prefill(slots, x, B, C, dt)
        want = [[ref.step(s, rounding(x[b, t]), rounding(B[b, t]), rounding(C[b, t]), dt[b, t])
                 for t in range(5)] for b, s in enumerate(slots)]
        worst = rel(y, np.array(want))
        for _ in range(30):
            W = int(rng.integers(1, 9))
            x, B, C, dt = self.tokens(rng, 2, W)
            y = cache.verify(slots, x, B, C, dt)
            accepted = rng.integers(1, W + 1, 2).astype(np.int32)
            for b, s in enumerate(slots):  # only the accepted prefix reaches the reference
                want = np.array([ref.step(s, rounding(x[b, t]), rounding(B[b, t]),
                                          rounding(C[b, t]), dt[b, t])
                                 for t in range(accepted[b])])
                worst = max(worst, rel(y[b, :accepted[b]], want))
            cache.commit(slots, accepted)
        for b, s in enumerate(slots):
            worst = max(worst, rel(cache.state(int(s)), ref.S[s]))
        self.assertLess(worst, tol, f"{mode}/{activation}")
        self.assertGreater(cache.stats()["flushes"], 4)
        return worst

    def test_module_names_its_version_and_build(self):
        self.assertRegex(replayssm.__version__, r"^\d+\.\d+\.\d+$")
        # A git commit (12 hex digits, maybe -dirty), "unknown", or -DREPLAYSSM_BUILD_COMMIT's value.
        self.assertRegex(replayssm.build_commit, r"^\S+$")

    @unittest.skipUnless(shutil.which("readelf"), "needs readelf")
    def test_module_uses_the_shared_cxx_runtime(self):
        # A private static libstdc++ in the module, beside the libstdc++.so.6 numpy loads, killed
        # the interpreter at the module's first exception (docs/python.md).
        dynamic = subprocess.run(["readelf", "-d", replayssm.__file__], capture_output=True,
                                 text=True, check=True).stdout
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic)
        self.assertIn("libstdc++.so.6", needed, "the module links no shared libstdc++")
        symbols = subprocess.run(["readelf", "--dyn-syms", "-W", replayssm.__file__],
                                 capture_output=True, text=True, check=True).stdout
        # Columns: Num, Value, Size, Type, Bind, Vis, Ndx (UND where imported), Name[@version].
        rows = [line.split() for line in symbols.splitlines()]
        own = [row for row in rows
               if len(row) >= 8 and row[7].split("@")[0] == "__cxa_throw" and row[6] != "UND"]
        self.assertEqual(own, [], "the module defines its own __cxa_throw")

    def test_fp32_mode_matches_the_recurrence(self):
        self.run_decode("fp32", "fp32", 1e-5)

    def test_bf16_activations_are_rounded_like_the_reference(self):
        self.run_decode("fp32", "bf16", 1e-5)

    def test_separate_fp8_within_its_encoding_error(self):
        # outputs read an fp8 copy (3 mantissa bits): a few percent per element at most
        self.run_decode("separate-fp8", "bf16", 5e-2)

    def test_decode_is_verify_of_one_and_commit(self):
        # [B, H, P] views (no token axis) through decode give verify(W = 1) + commit(1) bit for
        # bit, across flushes.
        a, b, slots, rng = self.twins("separate-fp8", [3, 4], activation="bf16")
        for _ in range(40):
            x, B, C, dt = self.tokens(rng, 2, 1)
            y = a.verify(slots, x, B, C, dt)
            a.commit(slots, np.ones(2, dtype=np.int32))
            y1 = b.decode(slots, x[:, 0], B[:, 0], C[:, 0], dt[:, 0])
            self.assertEqual(y1.shape, (2,) + self.shape[:2])
            np.testing.assert_array_equal(y1, y[:, 0])
        self.assertEqual(a.export_slot(0), b.export_slot(0))
        self.assertGreater(b.stats()["flushes"], 3)
        with self.assertRaisesRegex(replayssm.Error, "one token"):
            b.decode(slots, *self.tokens(rng, 2, 2))

    def test_rejected_drafts_leave_the_slot_unchanged(self):
        # Two caches see the same accepted tokens and different rejected drafts: after every
        # commit their slots are identical, through flushes (c + 6 > 16 every few steps).
        a, b, slot, rng = self.twins("separate-nvfp4", [3])
        prompt = self.tokens(rng, 1, 4)
        a.prefill(slot, *prompt)
        b.prefill(slot, *prompt)
        for _ in range(20):
            window = self.tokens(rng, 1, 6)
            other = self.tokens(rng, 1, 6)
            k = int(rng.integers(1, 4))
            for t, u in zip(window, other):
                u[:, :k] = t[:, :k]  # the accepted prefix is shared, the drafts after it differ
            a.verify(slot, *window)
            b.verify(slot, *other)
            a.commit(slot, np.array([k], dtype=np.int32))
            b.commit(slot, np.array([k], dtype=np.int32))
            self.assertEqual(a.cursors(0), b.cursors(0))
            np.testing.assert_array_equal(a.state(0), b.state(0))
            self.assertEqual(a.export_slot(0), b.export_slot(0))
        self.assertGreater(a.stats()["flushes"], 2)

    def test_dlpack_arrays_are_used_in_place(self):
        # The same step through numpy and through DLPack views (y written into the caller's
        # array) gives the same bits; DLPack inputs must already be of the activation dtype.
        a, b, slots, rng = self.twins("separate-fp8", [1, 2])
        for _ in range(12):
            x, B, C, dt = self.tokens(rng, 2, 4)
            y = a.verify(slots, x, B, C, dt)
            out = np.full_like(y, np.nan)
            ret = b.verify(Foreign(slots), Foreign(x), Foreign(B), Foreign(C), Foreign(dt),
                           y=Foreign(out))
            np.testing.assert_array_equal(out, y)
            self.assertIsInstance(ret, Foreign)
            accepted = rng.integers(1, 5, 2).astype(np.int32)
            a.commit(slots, accepted)
            b.commit(Foreign(slots), Foreign(accepted))
        self.assertEqual(a.export_slot(0), b.export_slot(0))
        x, B, C, dt = self.tokens(rng, 2, 4)
        with self.assertRaisesRegex(replayssm.Error, "C-contiguous"):
            b.verify(slots, Foreign(np.asfortranarray(x)), B, C, dt)
        with self.assertRaisesRegex(replayssm.Error, "bits 64"):
            b.verify(slots, Foreign(x.astype(np.float64)), B, C, dt)
        c = self.make("fp32", activation="bf16")[0]
        c.allocate(1)
        with self.assertRaisesRegex(replayssm.Error, "fp32"):  # float32 given to a bf16 cache
            c.verify(slots[:1], Foreign(x[:1]), Foreign(B[:1]), Foreign(C[:1]), Foreign(dt[:1]))

    def test_backend_availability(self):
        self.assertTrue(replayssm.backend_available("cpu"))
        self.assertIsInstance(replayssm.backend_available("cuda"), bool)
        with self.assertRaisesRegex(replayssm.Error, "unknown backend 'tpu'"):
            replayssm.backend_available("tpu")

    def test_errors_name_the_problem(self):
        cache, _, rng = self.make("fp32")
        slot = np.array([cache.allocate(1)], dtype=np.int32)
        with self.assertRaisesRegex(replayssm.Error, "window"):
            cache.verify(slot, *self.tokens(rng, 1, 9))  # above max_window
        cache.verify(slot, *self.tokens(rng, 1, 2))
        with self.assertRaisesRegex(ValueError, "pending"):  # replayssm.Error is a ValueError
            cache.commit(slot, np.array([3], dtype=np.int32))
        with self.assertRaisesRegex(replayssm.Error, "backend"):
            replayssm.ReplayCache(self.shape, backend="tpu", **self.params)
        self.assertIn("separate-fp8", repr(self.make("separate-fp8")[0]))


@unittest.skipUnless(importlib.util.find_spec("torch") is not None, "needs torch")
class TorchCudaTest(unittest.TestCase):
    """The CUDA backend from torch tensors (DLPack), against the CPU backend on the same inputs."""

    def test_cuda_matches_cpu(self):
        import torch
        if not torch.cuda.is_available():
            self.skipTest("no GPU")
        if not replayssm.backend_available("cuda"):
            self.skipTest("the module's cuda backend is not available (built without CUDA)")
        shape = (8, 64, 128, 2)
        H, P, N, G = shape
        rng = np.random.default_rng(9)
        params = dict(A_log=rng.uniform(-1, 1.5, H).astype(np.float32),
                      dt_bias=rng.uniform(-3, -1, H).astype(np.float32),
                      D=np.ones(H, np.float32))
        cpu = replayssm.ReplayCache(shape, mode="separate-fp8", num_slots=2, **params)
        gpu = replayssm.ReplayCache(shape, mode="separate-fp8", num_slots=2, backend="cuda",
                                    **params)
        slots = np.array([cpu.allocate(5), cpu.allocate(6)], dtype=np.int32)
        gpu.allocate(5), gpu.allocate(6)
        dslots = torch.from_numpy(slots).cuda()
        for step in range(20):
            W = 1 + step % 8
            x = torch.randn(2, W, H, P).to(torch.bfloat16)
            B = (0.3 * torch.randn(2, W, G, N)).to(torch.bfloat16)
            C = (0.3 * torch.randn(2, W, G, N)).to(torch.bfloat16)
            dt = torch.randn(2, W, H)
            y_cpu = cpu.verify(slots, x.float().numpy(), B.float().numpy(), C.float().numpy(),
                               dt.numpy())
            y = torch.empty(2, W, H, P, device="cuda")
            gpu.verify(dslots, x.cuda(), B.cuda(), C.cuda(), dt.cuda(), y=y)
            torch.cuda.synchronize()
            self.assertLess(rel(y.cpu().numpy(), y_cpu.astype(np.float64)), 2e-4)
            accepted = torch.randint(1, W + 1, (2,), dtype=torch.int32)
            cpu.commit(slots, accepted.numpy())
            gpu.commit(dslots, accepted.cuda())
        self.assertEqual(cpu.cursors(0), gpu.cursors(0))


if __name__ == "__main__":
    unittest.main()
