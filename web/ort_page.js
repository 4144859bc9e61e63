// One ONNX model in onnxruntime-web, on the execution provider asked for and no other.
// Used by runtime.html (driven by breakout_core.runtimes.browser_runtime) and play.html.
//
// The WebGPU build of onnxruntime-web carries both the 'wasm' and the 'webgpu' providers,
// so the two backends run the same library version. What actually ran is read back, not
// assumed: the adapter's own info, and onnxruntime's own node-placement lines ("All nodes
// placed on [WebGpuExecutionProvider]. Number of nodes: 11", or one line per provider when
// the graph is split), logged at verbose level while the session is created. A WebGPU
// session with nodes placed elsewhere is reported so; one with none on WebGPU is refused.

import * as ort from './node_modules/onnxruntime-web/dist/ort.webgpu.min.mjs';

ort.env.wasm.wasmPaths = new URL('./node_modules/onnxruntime-web/dist/', import.meta.url).href;

const OBS_SHAPE = [4, 84, 84];
const OBS_SIZE = 4 * 84 * 84;

export class Unavailable extends Error {}

function timerResolutionMs() {
  // The smallest step performance.now() shows; headless Chromium coarsens it (cross-origin
  // isolated pages get finer steps than others).
  let smallest = Infinity;
  let last = performance.now();
  for (let i = 0; i < 200000 && smallest > 1e-4; i++) {
    const now = performance.now();
    if (now > last) { smallest = Math.min(smallest, now - last); last = now; }
  }
  return smallest;
}

async function webgpuAdapter() {
  if (!('gpu' in navigator)) throw new Unavailable('navigator.gpu is missing: this browser exposes no WebGPU');
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Unavailable('navigator.gpu.requestAdapter() returned null: no WebGPU adapter here');
  const info = adapter.info || {};
  return {
    vendor: info.vendor || '', architecture: info.architecture || '', device: info.device || '',
    description: info.description || '', is_fallback_adapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
    software: /swiftshader/i.test(`${info.vendor} ${info.architecture} ${info.description}`),
  };
}

// Runs `create` with onnxruntime's verbose log on and every console line captured, and
// reads the node-placement lines out of it; the log level is put back afterwards.
async function capturePlacement(create) {
  const lines = [];
  const methods = ['log', 'info', 'warn', 'error', 'debug'];
  const saved = methods.map((m) => console[m]);
  const savedLevel = ort.env.logLevel;
  methods.forEach((m) => { console[m] = (...args) => lines.push(args.join(' ')); });
  ort.env.logLevel = 'verbose';
  let result;
  try {
    result = await create();
  } finally {
    methods.forEach((m, i) => { console[m] = saved[i]; });
    ort.env.logLevel = savedLevel;
  }
  const nodes = {};
  for (const line of lines) {
    const match = line.match(/(?:All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)/);
    if (match) nodes[match[1]] = (nodes[match[1]] || 0) + Number(match[2]);
  }
  return { result, nodes };
}

export function decodeObs(base64, batch) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  if (bytes.length !== batch * OBS_SIZE) throw new Error(`expected ${batch * OBS_SIZE} bytes, got ${bytes.length}`);
  return new ort.Tensor('uint8', bytes, [batch, ...OBS_SHAPE]);
}

export class PageModel {
  // provider: 'wasm' | 'webgpu'; numThreads: null keeps onnxruntime-web's default.
  static async load(modelUrl, provider, numThreads = null) {
    if (provider !== 'wasm' && provider !== 'webgpu') throw new Error(`unknown provider ${provider}`);
    if (numThreads !== null) ort.env.wasm.numThreads = numThreads;
    const adapter = provider === 'webgpu' ? await webgpuAdapter() : null;
    const started = performance.now();
    const placement = await capturePlacement(() =>
      ort.InferenceSession.create(modelUrl, { executionProviders: [provider], logSeverityLevel: 0, logVerbosityLevel: 0 }),
    ).catch((err) => {
      if (provider === 'webgpu') throw new Unavailable(`onnxruntime-web could not create a WebGPU session: ${err}`);
      throw err;
    });
    const session = placement.result;
    const model = new PageModel(session, provider);
    await model.run(new ort.Tensor('uint8', new Uint8Array(OBS_SIZE), [1, ...OBS_SHAPE]));
    const loadMs = performance.now() - started;
    const providers = Object.keys(placement.nodes);
    const wanted = provider === 'webgpu' ? 'WebGpuExecutionProvider' : 'CPUExecutionProvider';
    if (providers.length === 0) throw new Error('onnxruntime logged no node placement: cannot tell where the model ran');
    if (!providers.includes(wanted)) {
      throw new Unavailable(`no node was placed on ${wanted} (placement: ${JSON.stringify(placement.nodes)}); refusing the fallback`);
    }
    model.info = {
      requested_provider: provider,
      actual_provider: providers.length === 1 ? provider : `${provider} (split: ${providers.join(', ')})`,
      nodes_by_provider: placement.nodes,
      nodes_not_on_requested_provider: providers.filter((p) => p !== wanted).reduce((n, p) => n + placement.nodes[p], 0),
      adapter,
      wasm_threads: ort.env.wasm.numThreads,
      cross_origin_isolated: self.crossOriginIsolated,
      hardware_concurrency: navigator.hardwareConcurrency,
      user_agent: navigator.userAgent,
      onnxruntime_web: ort.env.versions.web,
      timer: 'performance.now()',
      timer_resolution_ms: timerResolutionMs(),
      load_ms: loadMs,
      input: session.inputNames[0],
      output: session.outputNames[0],
    };
    return model;
  }

  constructor(session, provider) {
    this.session = session;
    this.provider = provider;
  }

  async run(tensor) {
    const result = await this.session.run({ [this.session.inputNames[0]]: tensor });
    return result[this.session.outputNames[0]].data;
  }

  async qValues(base64, batch) {
    return Array.from(await this.run(decodeObs(base64, batch)));
  }

  // Q-values and how long session.run took by the page's clock (performance.now(); the
  // decoding of the states is outside it, as in timedRuns): one decision inside a game loop.
  async timedQValues(base64, batch) {
    const tensor = decodeObs(base64, batch);
    const start = performance.now();
    const q = await this.run(tensor);
    const ms = performance.now() - start;
    return { q: Array.from(q), ms };
  }

  // Untimed warm-up calls, then `iterations` calls each timed with performance.now(); the
  // input tensor is made once, outside the timed region, so only session.run is timed.
  async timedRuns(base64, batch, warmup, iterations) {
    const tensor = decodeObs(base64, batch);
    for (let i = 0; i < warmup; i++) await this.run(tensor);
    const samples = new Float64Array(iterations);
    for (let i = 0; i < iterations; i++) {
      const start = performance.now();
      await this.run(tensor);
      samples[i] = performance.now() - start;
    }
    return Array.from(samples);
  }

  async release() {
    await this.session.release();
  }
}
