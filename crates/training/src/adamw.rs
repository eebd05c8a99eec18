//! AdamW (Loshchilov & Hutter) with decoupled weight decay, written against burn tensors.
//!
//! The update for a parameter `p` with gradient `g` at its `t`-th step, with learning rate `lr`, matches
//! `torch.optim.AdamW` term for term (a committed fixture checks 20 steps):
//!
//! ```text
//! p ← p − lr·λ·p                         (only if the parameter decays)
//! m ← β1·m + (1−β1)·g
//! v ← β2·v + (1−β2)·g²
//! p ← p − (lr / (1−β1ᵗ)) · m / (sqrt(v) / sqrt(1−β2ᵗ) + ε)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::TrainError;
use crate::params::{Gradients, ParamInfo, PathStack, to_f32_vec};
use crate::tensor_file::{self, Array};

/// Which parameters receive weight decay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecayPolicy {
    /// Matrices (rank ≥ 2) except embeddings; norms, biases (rank 1) and embeddings are not decayed.
    #[default]
    MatricesExceptEmbeddings,
    /// Every matrix, embeddings included; rank-1 parameters are not decayed.
    Matrices,
    /// Every parameter.
    All,
}

impl DecayPolicy {
    /// Whether the parameter at `name` with shape `shape` is decayed. A parameter is an embedding when a path
    /// component contains `embed` (`embed_tokens`, `tok_embeddings`) or is `wte`/`wpe`.
    pub fn decays(self, name: &str, shape: &[usize]) -> bool {
        let is_embedding = name
            .split('.')
            .any(|part| part.contains("embed") || part == "wte" || part == "wpe");
        match self {
            DecayPolicy::MatricesExceptEmbeddings => shape.len() >= 2 && !is_embedding,
            DecayPolicy::Matrices => shape.len() >= 2,
            DecayPolicy::All => true,
        }
    }
}

/// AdamW hyper-parameters (the learning rate is given per step, by the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Decay rate of the first moment.
    pub beta1: f64,
    /// Decay rate of the second moment.
    pub beta2: f64,
    /// Added to the bias-corrected `sqrt(v)` before dividing.
    pub eps: f64,
    /// Decoupled weight decay λ (multiplied by the learning rate).
    pub weight_decay: f64,
    /// Which parameters decay.
    pub decay_policy: DecayPolicy,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            decay_policy: DecayPolicy::default(),
        }
    }
}

impl AdamWConfig {
    /// Checks every hyper-parameter against its range; the error names the field and the range. Out of range
    /// they do not fail, they corrupt: a beta of 1 never forgets (and divides by `1 - beta^t = 0`), a NaN anywhere
    /// makes every weight NaN after one step, a negative decay grows the weights.
    pub fn validate(&self) -> Result<(), TrainError> {
        let refuse = |key: &str, expected: &str, value: f64| {
            Err(TrainError::Unsupported {
                key: key.to_string(),
                message: format!("expected {expected}, found {value:?}"),
            })
        };
        for (key, value) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            // `contains` is false for NaN.
            if !(0.0..1.0).contains(&value) {
                return refuse(key, "a number in [0, 1)", value);
            }
        }
        if !(self.eps > 0.0 && self.eps <= 1.0) {
            return refuse("eps", "a number in (0, 1]", self.eps);
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return refuse("weight_decay", "a finite number >= 0", self.weight_decay);
        }
        Ok(())
    }
}

/// Moments and step count of one parameter, flattened to `[numel]`.
#[derive(Debug, Clone)]
struct Moments<B: Backend> {
    step: u64,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
}

/// The optimizer: its configuration and per-parameter state keyed by parameter path.
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    config: AdamWConfig,
    state: BTreeMap<String, Moments<B>>,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer with no state.
    pub fn new(config: AdamWConfig) -> Self {
        AdamW {
            config,
            state: BTreeMap::new(),
        }
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// How many updates the parameter at `name` has received (0 if none).
    pub fn param_steps(&self, name: &str) -> u64 {
        self.state.get(name).map_or(0, |s| s.step)
    }

    /// Applies one update with learning rate `lr` to every parameter of `module` that has a gradient in `grads`,
    /// and returns the updated module. Parameters keep their `require_grad` flag.
    pub fn step<AB, M>(&mut self, lr: f64, module: M, grads: &Gradients<B>) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        let mut mapper = Updater::<AB> {
            optimizer: self,
            grads,
            lr,
            path: PathStack::default(),
        };
        module.map(&mut mapper)
    }

    /// One AdamW update of a flattened parameter; returns the new value.
    fn update(
        &mut self,
        name: &str,
        shape: &[usize],
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        lr: f64,
    ) -> Tensor<B, 1> {
        let c = self.config;
        let previous = self.state.remove(name);
        let (step, m, v) = match previous {
            Some(s) => (s.step + 1, s.m.mul_scalar(c.beta1), s.v.mul_scalar(c.beta2)),
            None => (1, grad.zeros_like(), grad.zeros_like()),
        };
        let m = m + grad.clone().mul_scalar(1.0 - c.beta1);
        let v = v + grad.square().mul_scalar(1.0 - c.beta2);
        let param = if c.weight_decay > 0.0 && c.decay_policy.decays(name, shape) {
            param.mul_scalar(1.0 - lr * c.weight_decay)
        } else {
            param
        };
        let bias1 = 1.0 - c.beta1.powi(step as i32);
        let bias2 = 1.0 - c.beta2.powi(step as i32);
        let denom = v.clone().sqrt().div_scalar(bias2.sqrt()).add_scalar(c.eps);
        let param = param - m.clone().div(denom).mul_scalar(lr / bias1);
        self.state.insert(name.to_string(), Moments { step, m, v });
        param
    }

    /// Writes the state to a safetensors file: `<param>.exp_avg` and `<param>.exp_avg_sq` tensors (torch's names)
    /// and the per-parameter step counts in the metadata.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let mut arrays = BTreeMap::new();
        let mut steps = BTreeMap::new();
        for (name, s) in &self.state {
            let numel = s.m.shape().num_elements();
            arrays.insert(
                format!("{name}.exp_avg"),
                Array {
                    shape: vec![numel],
                    values: to_f32_vec(s.m.clone()),
                },
            );
            arrays.insert(
                format!("{name}.exp_avg_sq"),
                Array {
                    shape: vec![numel],
                    values: to_f32_vec(s.v.clone()),
                },
            );
            steps.insert(name.clone(), s.step);
        }
        let steps = serde_json::to_string(&steps).map_err(|e| TrainError::Json {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        tensor_file::write(path, &arrays, HashMap::from([("steps".to_string(), steps)]))
    }

    /// Restores state written by [`AdamW::save`] onto `device`, replacing the current state.
    pub fn load(&mut self, path: &Path, device: &B::Device) -> Result<(), TrainError> {
        let (mut arrays, metadata) = tensor_file::read(path)?;
        let json_error = |message: String| TrainError::Json {
            path: path.to_path_buf(),
            message,
        };
        let steps = metadata
            .get("steps")
            .ok_or_else(|| json_error("metadata has no `steps` entry".into()))?;
        let steps: BTreeMap<String, u64> =
            serde_json::from_str(steps).map_err(|e| json_error(e.to_string()))?;
        let mismatch = |name: String, message: String| TrainError::Mismatch {
            path: path.to_path_buf(),
            name,
            message,
        };
        let mut state = BTreeMap::new();
        for (name, step) in steps {
            // A saved step is at least 1 (the state exists after an update), and the bias corrections raise the
            // betas to its power as an `i32`.
            if step == 0 || step > i32::MAX as u64 {
                return Err(mismatch(
                    name,
                    format!("step count {step} in `steps`: expected 1..={}", i32::MAX),
                ));
            }
            let mut take = |suffix: &str| {
                let key = format!("{name}.{suffix}");
                let array = arrays
                    .remove(&key)
                    .ok_or_else(|| mismatch(key.clone(), "missing from the file".into()))?;
                Ok::<_, TrainError>((key, array.values))
            };
            let (m_key, m) = take("exp_avg")?;
            let (v_key, v) = take("exp_avg_sq")?;
            // The update adds both moments to the gradient element-wise: lengths that differ would panic there.
            if m.len() != v.len() {
                return Err(mismatch(
                    v_key,
                    format!("{} elements, but `{m_key}` has {}", v.len(), m.len()),
                ));
            }
            let tensor = |values: Vec<f32>| {
                let numel = values.len();
                Tensor::<B, 1>::from_data(TensorData::new(values, [numel]), device)
            };
            let (m, v) = (tensor(m), tensor(v));
            state.insert(name, Moments { step, m, v });
        }
        if let Some(extra) = arrays.into_keys().next() {
            return Err(mismatch(
                extra,
                "not the state of any parameter listed in the `steps` metadata".into(),
            ));
        }
        self.state = state;
        Ok(())
    }

    /// Checks that the state fits a model with parameters `params` ([`crate::parameters`]): every parameter with
    /// state exists and has as many elements as its moments, so a resumed update cannot meet a mismatched shape.
    /// `path` names the optimizer file the state came from.
    pub fn check_fits(&self, params: &[ParamInfo], path: &Path) -> Result<(), TrainError> {
        let sizes: HashMap<&str, usize> = params
            .iter()
            .map(|p| (p.name.as_str(), p.shape.iter().product()))
            .collect();
        for (name, moments) in &self.state {
            let numel = moments.m.shape().num_elements();
            let message = match sizes.get(name.as_str()) {
                None => "the model has no such parameter".to_string(),
                Some(&n) if n != numel => {
                    format!("{numel} elements of state, the parameter has {n}")
                }
                Some(_) => continue,
            };
            return Err(TrainError::Mismatch {
                path: path.to_path_buf(),
                name: format!("{name}.exp_avg"),
                message,
            });
        }
        Ok(())
    }
}

/// Walks the module, updating each float parameter that has a gradient.
struct Updater<'a, AB: AutodiffBackend> {
    optimizer: &'a mut AdamW<AB::InnerBackend>,
    grads: &'a Gradients<AB::InnerBackend>,
    lr: f64,
    path: PathStack,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for Updater<'_, AB> {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name, container);
    }

    fn exit_module(&mut self, _: &str, container: &str) {
        self.path.exit(container);
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let name = self.path.current();
        let Some(grad) = self.grads.get(&name) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let require_grad = tensor.is_require_grad();
        let dims = tensor.shape().dims::<D>();
        let inner = tensor.inner();
        let numel = inner.shape().num_elements();
        let updated =
            self.optimizer
                .update(&name, &dims, inner.reshape([numel]), grad.clone(), self.lr);
        let mut tensor = Tensor::<AB, D>::from_inner(updated.reshape(dims));
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_refuses_each_hyper_parameter_out_of_range() {
        assert!(AdamWConfig::default().validate().is_ok());
        let key_of = |c: AdamWConfig| match c.validate() {
            Err(TrainError::Unsupported { key, .. }) => key,
            other => panic!("{c:?}: expected a refusal, got {other:?}"),
        };
        let base = AdamWConfig::default();
        for (config, key) in [
            (AdamWConfig { beta1: 1.0, ..base }, "beta1"),
            (
                AdamWConfig {
                    beta1: -0.1,
                    ..base
                },
                "beta1",
            ),
            (
                AdamWConfig {
                    beta2: f64::NAN,
                    ..base
                },
                "beta2",
            ),
            (AdamWConfig { eps: 0.0, ..base }, "eps"),
            (
                AdamWConfig {
                    eps: f64::INFINITY,
                    ..base
                },
                "eps",
            ),
            (
                AdamWConfig {
                    eps: f64::NAN,
                    ..base
                },
                "eps",
            ),
            (
                AdamWConfig {
                    weight_decay: f64::NAN,
                    ..base
                },
                "weight_decay",
            ),
            (
                AdamWConfig {
                    weight_decay: -0.1,
                    ..base
                },
                "weight_decay",
            ),
            (
                AdamWConfig {
                    weight_decay: f64::INFINITY,
                    ..base
                },
                "weight_decay",
            ),
        ] {
            assert_eq!(key_of(config), key);
        }
        let edges = AdamWConfig {
            beta1: 0.0,
            beta2: 0.999_999,
            eps: 1.0,
            weight_decay: 0.0,
            ..base
        };
        assert!(edges.validate().is_ok());
    }
}
