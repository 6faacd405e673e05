// The example page: load a saved layer, run it, draw its attention, step a KV cache.
// Served from the repository root (see docs/browser.md), so the fixture's path resolves.
import init, { Engine } from "./pkg/wgpu_mha_web.js";

const LAYER = "../../tests/fixtures/weights/mha_packed_e32_h4.safetensors";
const TOKENS = 8;

// A deterministic input in [-1, 1): the page's numbers are the same on every run.
function input(length) {
  let s = 12345;
  return Float32Array.from({ length }, () => ((s = (s * 1103515245 + 12345) % 2147483648) / 1073741824) - 1);
}

// Head h's [L, L] weights as a grey-scale canvas (white = 1).
function heatmap(probs, h, l) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = l;
  canvas.title = `head ${h}`;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(l, l);
  for (let i = 0; i < l * l; i++) {
    const v = Math.round(255 * probs[h * l * l + i]);
    image.data.set([v, v, v, 255], 4 * i);
  }
  ctx.putImageData(image, 0, 0);
  return canvas;
}

async function main() {
  await init();
  const engine = await Engine.create();
  document.getElementById("adapter").textContent = `adapter: ${engine.adapter()}`;

  const bytes = new Uint8Array(await (await fetch(LAYER)).arrayBuffer());
  const layer = engine.load_module(bytes, null, null);
  const [dim, heads] = layer.sizes();
  const x = input(TOKENS * dim);

  // The whole sequence at once, causal, with the attention weights.
  const { output, probs } = await layer.forward(x, [1, TOKENS, dim], true, true);
  for (let h = 0; h < heads; h++) {
    document.getElementById("heatmaps").appendChild(heatmap(probs, h, TOKENS));
  }

  // The same tokens one at a time through a KV cache: each step's output is that row of the above.
  const cache = layer.new_cache(1, TOKENS);
  let worst = 0;
  for (let t = 0; t < TOKENS; t++) {
    const row = await cache.step(x.subarray(t * dim, (t + 1) * dim), [1, 1, dim]);
    for (let c = 0; c < dim; c++) {
      worst = Math.max(worst, Math.abs(row[c] - output[t * dim + c]));
    }
  }
  document.getElementById("output").textContent =
    `output[0, 0, :8] = ${Array.from(output.subarray(0, 8), (v) => v.toFixed(4)).join(" ")}\n` +
    `decode steps vs the whole sequence: max |diff| = ${worst.toExponential(2)} over ${cache.tokens()} tokens`;
  // A figure: SDPA on [1, 8, 512, 64] (the first call compiles; the second is timed, its readback included).
  const [h, l, d] = [8, 512, 64];
  const q = input(h * l * d);
  await engine.scaled_dot_product_attention(q, [1, h, l, d], q, [1, h, l, d], q, [1, h, l, d], null, null, false, null);
  const began = performance.now();
  await engine.scaled_dot_product_attention(q, [1, h, l, d], q, [1, h, l, d], q, [1, h, l, d], null, null, false, null);
  const seconds = (performance.now() - began) / 1000;
  const gflops = (4 * h * l * l * d) / seconds / 1e9;
  document.getElementById("output").textContent +=
    `\nSDPA [1, ${h}, ${l}, ${d}], not causal: ${(seconds * 1000).toFixed(1)} ms, ${gflops.toFixed(2)} GFLOP/s (upload and readback included)`;
  const ok = worst < 1e-5;
  document.getElementById("result").textContent = ok ? "ok" : `FAILED: decode differs by ${worst}`;
}

// With `?report`, the page posts its result line to the server that served it (web/check_example.py).
async function report() {
  if (new URLSearchParams(location.search).has("report")) {
    const body = document.getElementById("result").textContent + "\n" + document.getElementById("output").textContent;
    await fetch("/result", { method: "POST", body });
  }
}

main()
  .catch((e) => {
    document.getElementById("result").textContent = `FAILED: ${e}`;
  })
  .then(report);
