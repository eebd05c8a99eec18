//! Parameters addressed by their module path (`layers.0.attn.q.weight`).
//!
//! burn identifies parameters by random [`ParamId`](burn::module::ParamId)s that do not survive a save in another
//! format; paths do. Gradients, optimizer state and checkpoints are therefore keyed by path.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::TrainError;
use crate::tensor_file::{self, Array};

/// The dotted path of the parameter being visited, maintained from `enter_module`/`exit_module` calls.
///
/// The variant level burn reports for enum modules (a model's `Linear::Dense`) is left out, so a parameter's
/// path names what it is (`layers.0.attn.q.weight`), not how its layer is stored.
#[derive(Default)]
pub(crate) struct PathStack(Vec<String>);

impl PathStack {
    pub(crate) fn enter(&mut self, name: &str, container: &str) {
        if !container.starts_with("Enum:") {
            self.0.push(name.to_string());
        }
    }

    pub(crate) fn exit(&mut self, container: &str) {
        if !container.starts_with("Enum:") {
            self.0.pop();
        }
    }

    pub(crate) fn current(&self) -> String {
        self.0.join(".")
    }
}

/// A float parameter's path and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Dotted module path, e.g. `layers.0.mlp.up.weight`.
    pub name: String,
    /// Tensor shape.
    pub shape: Vec<usize>,
}

/// Lists the float parameters of `module` in visiting order.
pub fn parameters<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamInfo> {
    struct Lister(PathStack, Vec<ParamInfo>);
    impl<B: Backend> ModuleVisitor<B> for Lister {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.0.enter(name, container);
        }
        fn exit_module(&mut self, _: &str, container: &str) {
            self.0.exit(container);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.1.push(ParamInfo {
                name: self.0.current(),
                shape: param.val().shape().dims::<D>().to_vec(),
            });
        }
    }
    let mut lister = Lister(PathStack::default(), Vec::new());
    module.visit(&mut lister);
    lister.1
}

/// Gradients of a module's float parameters, flattened to `[numel]` and keyed by parameter path, on the inner
/// (non-autodiff) backend. Parameters that received no gradient are absent.
#[derive(Debug, Clone)]
pub struct Gradients<B: Backend> {
    tensors: BTreeMap<String, Tensor<B, 1>>,
}

impl<B: Backend> Gradients<B> {
    /// Takes the gradients of every parameter of `module` out of a `loss.backward()` result.
    pub fn from_backward<AB, M>(module: &M, mut grads: AB::Gradients) -> Self
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        struct Taker<'a, AB: AutodiffBackend> {
            path: PathStack,
            grads: &'a mut AB::Gradients,
            out: BTreeMap<String, Tensor<AB::InnerBackend, 1>>,
        }
        impl<AB: AutodiffBackend> ModuleVisitor<AB> for Taker<'_, AB> {
            fn enter_module(&mut self, name: &str, container: &str) {
                self.path.enter(name, container);
            }
            fn exit_module(&mut self, _: &str, container: &str) {
                self.path.exit(container);
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
                if let Some(grad) = param.val().grad_remove(self.grads) {
                    let numel = grad.shape().num_elements();
                    self.out.insert(self.path.current(), grad.reshape([numel]));
                }
            }
        }
        let mut taker = Taker::<AB> {
            path: PathStack::default(),
            grads: &mut grads,
            out: BTreeMap::new(),
        };
        module.visit(&mut taker);
        Gradients { tensors: taker.out }
    }

    /// Builds a gradient set from flattened tensors keyed by parameter path.
    pub fn from_tensors(tensors: BTreeMap<String, Tensor<B, 1>>) -> Self {
        Gradients { tensors }
    }

    /// The flattened gradients keyed by parameter path, in name order.
    pub fn into_tensors(self) -> BTreeMap<String, Tensor<B, 1>> {
        self.tensors
    }

    /// The flattened gradient of the parameter at `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor<B, 1>> {
        self.tensors.get(name)
    }

    /// Parameter paths that have a gradient, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of parameters with a gradient.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no parameter has a gradient.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Adds `other` element-wise (gradient accumulation over micro-batches); a parameter present in only one side
    /// keeps that side's gradient.
    pub fn accumulate(&mut self, other: Gradients<B>) {
        for (name, grad) in other.tensors {
            let sum = match self.tensors.remove(&name) {
                Some(mine) => mine + grad,
                None => grad,
            };
            self.tensors.insert(name, sum);
        }
    }

    /// Multiplies every gradient by `factor`.
    pub fn scale(&mut self, factor: f64) {
        let tensors = std::mem::take(&mut self.tensors);
        self.tensors = tensors
            .into_iter()
            .map(|(n, g)| (n, g.mul_scalar(factor)))
            .collect();
    }

    /// The L2 norm of all gradients concatenated: `sqrt(sum_p sum_i g_p[i]^2)`. One device synchronisation.
    pub fn global_norm(&self) -> f64 {
        let squares: Vec<Tensor<B, 1>> = self
            .tensors
            .values()
            .map(|g| g.clone().square().sum())
            .collect();
        if squares.is_empty() {
            return 0.0;
        }
        let total: f64 = Tensor::cat(squares, 0).sum().into_scalar().to_f64();
        total.sqrt()
    }

    /// Scales all gradients so their global norm is at most `max_norm` (as `torch.nn.utils.clip_grad_norm_` does,
    /// with its `1e-6` guard) and returns the norm before clipping. `max_norm <= 0` only measures.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> f64 {
        let norm = self.global_norm();
        if max_norm > 0.0 {
            let coef = max_norm / (norm + 1e-6);
            if coef < 1.0 {
                self.scale(coef);
            }
        }
        norm
    }
}

trait ScalarToF64 {
    fn to_f64(self) -> f64;
}

impl<E: burn::tensor::ElementConversion> ScalarToF64 for E {
    fn to_f64(self) -> f64 {
        self.elem::<f64>()
    }
}

/// Reads a tensor back as `f32` values (any float dtype is converted).
pub(crate) fn to_f32_vec<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_default()
}

/// Saves every float parameter of `module` to a safetensors file keyed by parameter path, bit-exactly (f32).
pub fn save_parameters<B: Backend, M: Module<B>>(
    module: &M,
    path: &Path,
) -> Result<(), TrainError> {
    struct Collector(PathStack, BTreeMap<String, Array>);
    impl<B: Backend> ModuleVisitor<B> for Collector {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.0.enter(name, container);
        }
        fn exit_module(&mut self, _: &str, container: &str) {
            self.0.exit(container);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let shape = value.shape().dims::<D>().to_vec();
            self.1.insert(
                self.0.current(),
                Array {
                    shape,
                    values: to_f32_vec(value),
                },
            );
        }
    }
    let mut collector = Collector(PathStack::default(), BTreeMap::new());
    module.visit(&mut collector);
    tensor_file::write(path, &collector.1, HashMap::new())
}

/// Loads parameters written by [`save_parameters`] into `module`. Every float parameter must be present with the
/// same shape; parameters that required gradients still do.
pub fn load_parameters<B: Backend, M: Module<B>>(module: M, path: &Path) -> Result<M, TrainError> {
    struct Loader {
        path: PathStack,
        arrays: BTreeMap<String, Array>,
        file: std::path::PathBuf,
        error: Option<TrainError>,
    }
    impl<B: Backend> ModuleMapper<B> for Loader {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _: &str, container: &str) {
            self.path.exit(container);
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let name = self.path.current();
            let shape = tensor.shape().dims::<D>().to_vec();
            let mismatch = |message: String| TrainError::Mismatch {
                path: self.file.clone(),
                name: name.clone(),
                message,
            };
            let tensor = match self.arrays.remove(&name) {
                Some(array) if array.shape == shape => {
                    let loaded = Tensor::<B, D>::from_data(
                        TensorData::new(array.values, shape),
                        &tensor.device(),
                    );
                    if tensor.is_require_grad() {
                        loaded.require_grad()
                    } else {
                        loaded
                    }
                }
                Some(array) => {
                    self.error.get_or_insert(mismatch(format!(
                        "expected shape {shape:?}, found {:?}",
                        array.shape
                    )));
                    tensor
                }
                None => {
                    self.error
                        .get_or_insert(mismatch("missing from the file".into()));
                    tensor
                }
            };
            Param::from_mapped_value(id, tensor, mapper)
        }
    }
    let (arrays, _) = tensor_file::read(path)?;
    let mut loader = Loader {
        path: PathStack::default(),
        arrays,
        file: path.to_path_buf(),
        error: None,
    };
    let module = module.map(&mut loader);
    match loader.error {
        Some(error) => Err(error),
        None => Ok(module),
    }
}
