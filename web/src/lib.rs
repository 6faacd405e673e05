//! wgpu-mha in the browser: the engine on WebGPU, for JavaScript.
//!
//! Everything here is async (a browser may not block): `await Engine.create()` makes the device,
//! and each call returns a `Promise`. The Rust API is the crate's own, whose async forms
//! ([`Gpu::new_async`], [`GpuTensor::read_async`], [`Case::run_async`]) are what runs on the
//! web; its blocking forms return `Err(Unsupported)` there, by name.

use js_sys::{Float32Array, Promise, Uint8Array};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;
use wgpu_mha::sdpa::{
    scaled_dot_product_attention, CausalAlignment, DeviceTensor, Layout, SdpaOptions,
};

use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    AttentionWeights, Case, ForwardOptions, Gpu, GpuForwardOutput, GpuOptions, GpuTensor, KvCache,
    Mask, MaskTensor, MultiHeadAttention, Tensor,
};

/// A WebGPU device with the engine's compiled passes (`await Engine.create()`).
#[wasm_bindgen]
pub struct Engine {
    gpu: Gpu,
}

fn js_error(e: wgpu_mha::Error) -> JsValue {
    JsError::new(&e.to_string()).into()
}

#[wasm_bindgen]
impl Engine {
    /// The browser's WebGPU adapter and a device on it. Rejects when the browser offers none.
    pub async fn create() -> Result<Engine, JsValue> {
        let gpu = Gpu::new_async(&GpuOptions::default())
            .await
            .map_err(js_error)?;
        Ok(Engine { gpu })
    }

    /// The adapter as the browser describes it (browsers may withhold its name) and the
    /// backend, e.g. `WebGPU adapter (BrowserWebGpu)`.
    pub fn adapter(&self) -> String {
        let info = self.gpu.info();
        let name = if info.name.is_empty() {
            "WebGPU adapter"
        } else {
            &info.name
        };
        format!("{name} ({:?})", info.backend)
    }

    /// `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=…,
    /// scale=…)` on row-major arrays: `q` `[B, H, Lq, D]`, `k` `[B, H_kv, Lk, D]`, `v`
    /// `[B, H_kv, Lk, Dv]` (`H_kv` dividing `H`: grouped-query attention), shapes as arrays of
    /// four numbers. `attn_mask` (or `null`) has torch's polarities: a `Uint8Array` is a bool
    /// mask (nonzero = the key takes part), a `Float32Array` is added to the scores; its
    /// `mask_shape` (2 to 4 dims) broadcasts right-aligned to `[B, H, Lq, Lk]`, and a query whose
    /// every key is masked out gets zeros, as torch gives. `is_causal` is torch's (top-left
    /// aligned; not with a mask); `scale` defaults to `1/√D`. Resolves to the output
    /// `[B, H, Lq, Dv]`.
    #[allow(clippy::too_many_arguments)] // torch's own argument list
    pub fn scaled_dot_product_attention(
        &self,
        q: Float32Array,
        q_shape: Vec<usize>,
        k: Float32Array,
        k_shape: Vec<usize>,
        v: Float32Array,
        v_shape: Vec<usize>,
        attn_mask: JsValue,
        mask_shape: Option<Vec<usize>>,
        is_causal: bool,
        scale: Option<f32>,
    ) -> Promise {
        let gpu = self.gpu.clone();
        let inputs = [(q, q_shape), (k, k_shape), (v, v_shape)].map(|(a, s)| (a.to_vec(), s));
        let mask = js_mask(&attn_mask, mask_shape);
        future_to_promise(async move {
            let output = sdpa(&gpu, inputs, mask.map_err(js_error)?, is_causal, scale)
                .await
                .map_err(js_error)?;
            Ok(Float32Array::from(output.data()).into())
        })
    }

    /// Runs a case file (its bytes, e.g. from `fetch`) and resolves to
    /// `{name, passed, max_abs_err, bound}`: the file's module on its inputs, against its f64
    /// answer, by the rule `wgpu-mha check` applies natively.
    pub fn check_case(&self, name: String, bytes: Vec<u8>) -> Promise {
        let gpu = self.gpu.clone();
        future_to_promise(async move {
            let case = Case::from_bytes(name.clone(), bytes).map_err(js_error)?;
            let result = case
                .run_async(&gpu, &ForwardOptions::default())
                .await
                .map_err(js_error)?;
            let report = js_sys::Object::new();
            set(&report, "name", name.into())?;
            set(&report, "passed", result.passed().into())?;
            set(&report, "max_abs_err", result.max_abs_err.into())?;
            set(&report, "bound", result.bound.into())?;
            Ok(report.into())
        })
    }
}

/// An attention module on the engine's device (`engine.load_module(bytes)`): its weights
/// uploaded once, its passes compiled once.
#[wasm_bindgen]
pub struct Module {
    gpu: Gpu,
    mha: Rc<MultiHeadAttention>,
}

#[wasm_bindgen]
impl Engine {
    /// A module from a safetensors file's bytes, as the native `run --weights` reads one: the
    /// seed's `W_q…W_o` or `nn.MultiheadAttention`'s state dict (packed or separate
    /// projections), `prefix` before every name, the head count from the file's metadata or
    /// `heads`. Throws naming what is missing or inconsistent.
    pub fn load_module(
        &self,
        bytes: &[u8],
        prefix: Option<String>,
        heads: Option<usize>,
    ) -> Result<Module, JsValue> {
        let loaded =
            AttentionWeights::from_safetensors_bytes(bytes, prefix.as_deref().unwrap_or(""), heads)
                .map_err(js_error)?;
        let mha =
            MultiHeadAttention::new(&self.gpu, loaded.config, &loaded.weights).map_err(js_error)?;
        Ok(Module {
            gpu: self.gpu.clone(),
            mha: Rc::new(mha),
        })
    }
}

#[wasm_bindgen]
impl Module {
    /// `[model_dim, heads]` of the module.
    pub fn sizes(&self) -> Vec<usize> {
        let c = self.mha.config();
        vec![c.model_dim, c.heads]
    }

    /// Self-attention on `x` `[B, L, model_dim]` (row-major), `causal` or not. Resolves to
    /// `{output: Float32Array [B, L, model_dim], probs: Float32Array [B, H, L, L] | undefined}`
    /// (the attention weights when `with_probs`, from the multi-pass path).
    pub fn forward(
        &self,
        x: Float32Array,
        shape: Vec<usize>,
        causal: bool,
        with_probs: bool,
    ) -> Promise {
        let (gpu, mha) = (self.gpu.clone(), self.mha.clone());
        let x = x.to_vec();
        future_to_promise(async move {
            let x = GpuTensor::upload(&gpu, &Tensor::new(shape, x).map_err(js_error)?)
                .map_err(js_error)?;
            let mask = if causal { Mask::Causal } else { Mask::None };
            let options = ForwardOptions {
                return_probs: with_probs,
                ..Default::default()
            };
            let ran = mha
                .forward_gpu_with(&x, &x, &x, &mask, &options)
                .map_err(js_error)?;
            read_forward(&gpu, ran).await
        })
    }

    /// A KV cache of `capacity` tokens for `batch` sequences, for [`Cache::step`].
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<Cache, JsValue> {
        let cache = KvCache::new(&self.mha, batch, capacity).map_err(js_error)?;
        Ok(Cache {
            gpu: self.gpu.clone(),
            mha: self.mha.clone(),
            cache: Rc::new(RefCell::new(cache)),
        })
    }
}

/// A Hugging Face checkpoint's attention layer (`engine.load_hf_layer(bytes, config, layer)`):
/// the module as transformers runs it — its mask rule (causal, windows, relative biases), RoPE,
/// norms — on hidden states.
#[wasm_bindgen]
pub struct HfLayer {
    gpu: Gpu,
    mha: Rc<MultiHeadAttention>,
    module: Rc<HfAttention>,
}

#[wasm_bindgen]
impl Engine {
    /// Layer `layer`'s self-attention from a checkpoint's `model.safetensors` bytes and its
    /// `config.json` text (or `null`: the file's metadata `hf_config`), as `run --hf` loads it:
    /// an unknown `model_type`, or a config key whose meaning the engine does not implement,
    /// throws naming it.
    pub fn load_hf_layer(
        &self,
        bytes: Vec<u8>,
        config_json: Option<String>,
        layer: usize,
    ) -> Result<HfLayer, JsValue> {
        let checkpoint =
            HfCheckpoint::from_bytes("model.safetensors", bytes, config_json.as_deref())
                .map_err(js_error)?;
        let prefix = checkpoint.layer_prefix(layer).map_err(js_error)?;
        let module = checkpoint.attention(&prefix, None).map_err(js_error)?;
        if module.cross {
            return Err(JsError::new(&format!(
                "`{prefix}` is a cross-attention module; load_hf_layer runs self-attention"
            ))
            .into());
        }
        let mha =
            MultiHeadAttention::new(&self.gpu, module.config, &module.weights).map_err(js_error)?;
        Ok(HfLayer {
            gpu: self.gpu.clone(),
            mha: Rc::new(mha),
            module: Rc::new(module),
        })
    }
}

#[wasm_bindgen]
impl HfLayer {
    /// `[hidden_size, heads]` of the layer.
    pub fn sizes(&self) -> Vec<usize> {
        let c = self.mha.config();
        vec![c.model_dim, c.heads]
    }

    /// Whether the layer attends causally (a decoder's self-attention).
    pub fn causal(&self) -> bool {
        self.module.causal
    }

    /// The layer on hidden states `[B, L, hidden_size]` at positions 0 … L − 1, every token
    /// real. Resolves to `{output, probs}` as [`Module::forward`] does.
    pub fn forward(&self, hidden: Float32Array, shape: Vec<usize>, with_probs: bool) -> Promise {
        let (gpu, mha, module) = (self.gpu.clone(), self.mha.clone(), self.module.clone());
        let hidden = hidden.to_vec();
        future_to_promise(async move {
            let hidden = Tensor::new(shape, hidden).map_err(js_error)?;
            // MLA's core runs on its pre-stage's query input and latent.
            let (query, key) = module.inputs(&hidden).map_err(js_error)?;
            let c = mha.config();
            c.check_inputs(query.shape(), key.shape(), key.shape())
                .map_err(js_error)?;
            let dims = AttnDims {
                batch: query.shape()[0],
                heads: c.heads,
                lq: query.shape()[1],
                lk: key.shape()[1],
            };
            let mask = module.mask_for(&hidden, dims, None).map_err(js_error)?;
            let query = GpuTensor::upload(&gpu, &query).map_err(js_error)?;
            let key = GpuTensor::upload(&gpu, &key).map_err(js_error)?;
            let options = ForwardOptions {
                return_probs: with_probs,
                ..Default::default()
            };
            let ran = mha
                .forward_gpu_with(&query, &key, &key, &mask, &options)
                .map_err(js_error)?;
            read_forward(&gpu, ran).await
        })
    }
}

/// `{output, probs}` of a forward, read back.
async fn read_forward(gpu: &Gpu, ran: GpuForwardOutput) -> Result<JsValue, JsValue> {
    let report = js_sys::Object::new();
    let output = ran.output.read_async(gpu).await.map_err(js_error)?;
    set(&report, "output", Float32Array::from(output.data()).into())?;
    if let Some(probs) = &ran.probs {
        let probs = probs.read_async(gpu).await.map_err(js_error)?;
        set(&report, "probs", Float32Array::from(probs.data()).into())?;
    }
    Ok(report.into())
}

/// A module's KV cache, stepping tokens (`module.new_cache(batch, capacity)`).
#[wasm_bindgen]
pub struct Cache {
    gpu: Gpu,
    mha: Rc<MultiHeadAttention>,
    cache: Rc<RefCell<KvCache>>,
}

#[wasm_bindgen]
impl Cache {
    /// Appends `x` `[B, n, model_dim]` (the next `n` tokens of every sequence) and resolves to
    /// their outputs `[B, n, model_dim]`, each token attending to every cached token and the
    /// new ones up to itself (a causal decoder's step).
    pub fn step(&self, x: Float32Array, shape: Vec<usize>) -> Promise {
        let (gpu, mha, cache) = (self.gpu.clone(), self.mha.clone(), self.cache.clone());
        let x = x.to_vec();
        future_to_promise(async move {
            let x = GpuTensor::upload(&gpu, &Tensor::new(shape, x).map_err(js_error)?)
                .map_err(js_error)?;
            // The step is recorded and submitted before the borrow ends; only the read waits.
            let out = {
                let mut cache = cache
                    .try_borrow_mut()
                    .map_err(|_| JsError::new("the cache is already stepping"))?;
                mha.forward_step_gpu(&mut cache, &x).map_err(js_error)?
            };
            let out = out.read_async(&gpu).await.map_err(js_error)?;
            Ok(Float32Array::from(out.data()).into())
        })
    }

    /// Tokens cached so far (`tokens`, not `len`: JS gives `length` its own meaning).
    pub fn tokens(&self) -> usize {
        self.cache.borrow().len()
    }
}

fn set(object: &js_sys::Object, key: &str, value: JsValue) -> Result<(), JsValue> {
    js_sys::Reflect::set(object, &key.into(), &value).map(|_| ())
}

/// A JS `attn_mask` as a host mask of torch's polarities, its shape lifted to four dims.
fn js_mask(mask: &JsValue, shape: Option<Vec<usize>>) -> wgpu_mha::Result<Option<SdpaMask>> {
    if mask.is_null() || mask.is_undefined() {
        return Ok(None);
    }
    let misuse = |what: String| wgpu_mha::Error::Misuse(what);
    let shape = shape.ok_or_else(|| misuse("attn_mask needs its mask_shape".into()))?;
    if !(2..=4).contains(&shape.len()) {
        return Err(misuse(format!(
            "attn_mask's shape {shape:?} needs 2 to 4 dims ([Lq, Lk] at least, as torch's)"
        )));
    }
    let shape: Vec<usize> = std::iter::repeat_n(1, 4 - shape.len())
        .chain(shape)
        .collect();
    if let Some(bools) = mask.dyn_ref::<Uint8Array>() {
        let data = bools.to_vec();
        let tensor = MaskTensor::new(shape, data)?;
        Ok(Some(SdpaMask::Bool(tensor)))
    } else if let Some(floats) = mask.dyn_ref::<Float32Array>() {
        Ok(Some(SdpaMask::Float(Tensor::new(shape, floats.to_vec())?)))
    } else {
        Err(misuse(
            "attn_mask must be a Uint8Array (bool: nonzero = attend), a Float32Array (added to \
             the scores) or null"
                .into(),
        ))
    }
}

/// An SDPA mask of torch's polarities, `[b, h, Lq, Lk]` with `b`, `h` broadcasting.
pub enum SdpaMask {
    /// Nonzero = the key takes part.
    Bool(MaskTensor),
    /// Added to the scaled scores.
    Float(Tensor),
}

impl SdpaMask {
    /// Whether each `[B, H, Lq]` query has no key left (torch gives such rows zeros).
    fn dead_rows(&self, [b, h, lq]: [usize; 3]) -> Vec<bool> {
        let (shape, dead_at): (&[usize], Box<dyn Fn(usize) -> bool + '_>) = match self {
            SdpaMask::Bool(m) => (m.shape(), Box::new(|i| m.data()[i] == 0)),
            SdpaMask::Float(t) => (t.shape(), Box::new(|i| t.data()[i] == f32::NEG_INFINITY)),
        };
        let (mb, mh, lk) = (shape[0], shape[1], shape[3]);
        let mut dead = Vec::with_capacity(b * h * lq);
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..lq {
                    let row = ((bi % mb * mh + hi % mh) * lq + i) * lk;
                    dead.push((row..row + lk).all(&dead_at));
                }
            }
        }
        dead
    }
}

/// The engine's SDPA on host data: uploaded, run, read back without blocking.
pub async fn sdpa(
    gpu: &Gpu,
    [(q, q_shape), (k, k_shape), (v, v_shape)]: [(Vec<f32>, Vec<usize>); 3],
    mask: Option<SdpaMask>,
    is_causal: bool,
    scale: Option<f32>,
) -> wgpu_mha::Result<Tensor> {
    let four = |name: &str, shape: &[usize]| -> wgpu_mha::Result<[usize; 4]> {
        shape.try_into().map_err(|_| {
            wgpu_mha::Error::Misuse(format!("{name}'s shape {shape:?} is not [B, H, L, D]"))
        })
    };
    let (qs, ks, vs) = (
        four("q", &q_shape)?,
        four("k", &k_shape)?,
        four("v", &v_shape)?,
    );
    if is_causal && mask.is_some() {
        return Err(wgpu_mha::Error::Misuse(
            "attn_mask and is_causal together: torch refuses them, give one".into(),
        ));
    }
    if let Some(m) = &mask {
        let shape = match m {
            SdpaMask::Bool(t) => t.shape(),
            SdpaMask::Float(t) => t.shape(),
        };
        let fits = (shape[0] == 1 || shape[0] == qs[0])
            && (shape[1] == 1 || shape[1] == qs[1])
            && shape[2] == qs[2]
            && shape[3] == ks[2];
        if !fits {
            return Err(wgpu_mha::Error::Misuse(format!(
                "attn_mask of shape {shape:?} does not broadcast to [B, H, Lq, Lk] = [{}, {}, {}, {}]",
                qs[0], qs[1], qs[2], ks[2]
            )));
        }
    }
    let q = GpuTensor::upload(gpu, &Tensor::new(q_shape, q)?)?;
    let k = GpuTensor::upload(gpu, &Tensor::new(k_shape, k)?)?;
    let v = GpuTensor::upload(gpu, &Tensor::new(v_shape, v)?)?;
    let out_shape = [qs[0], qs[1], qs[2], vs[3]];
    let out = GpuTensor::zeros(gpu, &out_shape)?;
    let dead = mask.as_ref().map(|m| m.dead_rows([qs[0], qs[1], qs[2]]));
    let options = SdpaOptions {
        mask: match mask {
            None if is_causal => Mask::Causal,
            None => Mask::None,
            Some(SdpaMask::Bool(m)) => Mask::Attend(m),
            Some(SdpaMask::Float(t)) => Mask::Bias(t),
        },
        causal_alignment: CausalAlignment::TopLeft,
        scale,
        ..Default::default()
    };
    scaled_dot_product_attention(
        gpu,
        &view(&q, qs),
        &view(&k, ks),
        &view(&v, vs),
        &view(&out, out_shape),
        &options,
    )?;
    let mut output = out.read_async(gpu).await?;
    if let Some(dead) = dead {
        let dv = vs[3];
        for (row, _) in dead.iter().enumerate().filter(|(_, d)| **d) {
            output.data_mut()[row * dv..(row + 1) * dv].fill(0.0);
        }
    }
    Ok(output)
}

fn view(t: &GpuTensor, shape: [usize; 4]) -> DeviceTensor<'_> {
    DeviceTensor::new(t.buffer(), shape, Layout::Bhld)
}
