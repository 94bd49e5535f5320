#!/usr/bin/env python3
"""The GPU's SM clock, power and temperature while a measurement runs, sampled by nvidia-smi.

A floor computed from a GEMM ceiling that torch measured in a few seconds assumes the clocks of a
short burst; a prefill that runs for half a minute at full power may run at lower clocks. Two H100s
gave the same build's 1M-token prefill 26.8 and 27.7 s with GEMM ceilings within 1% of each other
(docs/benchmarks.md, forty-ninth session). Sampling the clocks during both tells a throttled
machine from a slower build:

    with ClockSampler() as clocks:
        run_the_measurement()
    print(summary_text(clocks.summary()))

Without nvidia-smi (or when it reports nothing) the summary is None and the text says so.

    python3 tools/bench/gpu_clocks.py --self-test     # the parser, on canned nvidia-smi lines
"""
import os
import shutil
import subprocess
import sys
import threading

# SM clock (MHz), its rated maximum (MHz), board power (W), temperature (C).
QUERY = "clocks.sm,clocks.max.sm,power.draw,temperature.gpu"


def gpu_index():
    """The first visible GPU's index for nvidia-smi -i (CUDA_VISIBLE_DEVICES' first entry when it
    is a number, else 0: the device a process without the variable opens)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first if first.isdigit() else "0"


def parse_sample(line):
    """One line of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`: a tuple of four
    floats, or None for a line that is not one ("[N/A]" fields, blank lines, messages)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        return None


def summarize(samples):
    """{sm_mhz_mean, sm_mhz_min, sm_mhz_max_rated, power_w_mean, temp_c_max, samples}, or None."""
    if not samples:
        return None
    sm = [s[0] for s in samples]
    return {"sm_mhz_mean": sum(sm) / len(sm), "sm_mhz_min": min(sm),
            "sm_mhz_max_rated": samples[-1][1],
            "power_w_mean": sum(s[2] for s in samples) / len(samples),
            "temp_c_max": max(s[3] for s in samples), "samples": len(samples)}


def summary_text(summary):
    if not summary:
        return "clocks not sampled (no nvidia-smi samples)"
    return (f"SM {summary['sm_mhz_mean']:.0f} MHz mean, {summary['sm_mhz_min']:.0f} min "
            f"(rated {summary['sm_mhz_max_rated']:.0f}), {summary['power_w_mean']:.0f} W, "
            f"{summary['temp_c_max']:.0f} C max, {summary['samples']} samples")


class ClockSampler:
    """A context manager: nvidia-smi samples the GPU every `interval_ms` while the block runs."""

    def __init__(self, interval_ms=200):
        self.interval_ms = interval_ms
        self.samples = []
        self.process = None
        self.thread = None

    def __enter__(self):
        self.samples = []
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        self.process = subprocess.Popen(
            [exe, "-i", gpu_index(), f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
             f"-lms={self.interval_ms}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self):
        for line in self.process.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc):
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.thread.join(timeout=5)
        return False

    def summary(self):
        return summarize(list(self.samples))


def self_test():
    lines = ["1980, 1980, 512.30, 55\n", "1755, 1980, 690.00, 71\n", "[N/A], 1980, 100, 40\n",
             "\n", "No devices were found\n"]
    samples = [s for s in map(parse_sample, lines) if s is not None]
    assert samples == [(1980.0, 1980.0, 512.3, 55.0), (1755.0, 1980.0, 690.0, 71.0)], samples
    summary = summarize(samples)
    assert summary["sm_mhz_mean"] == 1867.5 and summary["sm_mhz_min"] == 1755.0, summary
    assert summary["temp_c_max"] == 71.0 and summary["samples"] == 2, summary
    assert summarize([]) is None and "not sampled" in summary_text(None)
    print(summary_text(summary))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(__doc__)
