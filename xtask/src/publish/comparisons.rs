//! The comparisons `docs/performance.md` shows: those criterion records ([`COMPARISONS`]: two
//! functions of one group), and those the benches record themselves ([`PAIRED`]).

use super::bounds::{self, Model};

/// The quintic's work model.
const NS5: &str = "the quintic's five Newton–Schulz steps on an m×n matrix, 5·(4r²s + 2r³) \
                   flops (r = min(m, n), s = max(m, n): the Gram product 2r²s, its square 2r³, \
                   the product with X 2r²s), against the f32 GEMM limit";

/// A values-only SVD's work model.
const BIDIAGONAL: &str = "the Householder bidiagonalization that starts a values-only SVD, \
                          4r²s − 4r³/3 flops (Golub & Van Loan), against the GEMM limit of the \
                          shape's element type";

/// One comparison: two functions of one criterion group, compared at every parameter both
/// measured in a run.
pub(crate) struct Comparison {
    /// The `--bench` target that measures it.
    pub(crate) bench: &'static str,
    /// The criterion group id.
    pub(crate) group: &'static str,
    /// kappa's function id in the group.
    pub(crate) kappa: &'static str,
    /// The peer's function id in the group.
    pub(crate) peer: &'static str,
    /// What the peer's time is multiplied by before the ratio (5 for five GEMM steps).
    pub(crate) peer_factor: f64,
    /// The table's heading.
    pub(crate) title: &'static str,
    /// What is compared, in a sentence or two.
    pub(crate) what: &'static str,
    /// The work of one kappa call at a parameter, against its physical limit.
    pub(crate) work: Option<Model>,
}

/// Every comparison the benches record in criterion's files.
pub(crate) const COMPARISONS: &[Comparison] = &[
    Comparison {
        bench: "linalg",
        group: "singular_values",
        kappa: "gesvd",
        peer: "torch_svdvals",
        peer_factor: 1.0,
        title: "Singular values against torch.linalg",
        what:
            "kappa-linalg's `singular_values` (LAPACK's QR iteration, `gesvd`) against libtorch's \
               `svdvals` (through `torch.linalg.matrix_norm(A, 2)`), f32 and f64.",
        work: Some(Model {
            formula: BIDIAGONAL,
            of: bounds::bidiagonal_flops,
        }),
    },
    Comparison {
        bench: "linalg",
        group: "condition_number",
        kappa: "kappa_linalg",
        peer: "torch_cond",
        peer_factor: 1.0,
        title: "Condition number against torch.linalg.cond",
        what:
            "kappa-linalg's `condition_number` (σ₁/σ_k from the singular values, +∞ at numerical \
               rank deficiency) against `torch.linalg.cond(A, 2)`.",
        work: Some(Model {
            formula: BIDIAGONAL,
            of: bounds::bidiagonal_flops,
        }),
    },
    Comparison {
        bench: "linalg",
        group: "ns5_ndarray_f32",
        kappa: "ns5",
        peer: "sgemm_step",
        peer_factor: 5.0,
        title: "Newton–Schulz on ndarray against the GEMM bound",
        what:
            "Five quintic Newton–Schulz steps (`newton_schulz_muon`, f32 `ndarray`) against five \
               times one step's three products run as plain GEMMs on preallocated buffers: 1 is \
               the machine's GEMM throughput, below 1 the symmetric products' saving.",
        work: Some(Model {
            formula: NS5,
            of: bounds::ns5_flops,
        }),
    },
    Comparison {
        bench: "linalg",
        group: "ns5_tch_f32",
        kappa: "ns5",
        peer: "sgemm_step",
        peer_factor: 5.0,
        title: "Newton–Schulz on tch tensors against the GEMM bound",
        what: "The same on f32 `tch::Tensor`s, against libtorch's own GEMMs.",
        work: Some(Model {
            formula: NS5,
            of: bounds::ns5_flops,
        }),
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_vjp",
        peer: "autograd_backward",
        peer_factor: 1.0,
        title: "Attention weight VJP against one autograd backward",
        what: "kappa-attention's weight VJP from a cached forward pass against one tch autograd \
               backward of the same head (retained graph), f64.",
        work: Some(Model {
            formula: "the weight VJP's 6NDk + 8N²k flops (the three weight gradients, and the \
                      score and value products' two gradients each) against the f64 GEMM limit",
            of: bounds::attention_vjp_flops,
        }),
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_forward_vjp",
        peer: "autograd_forward_backward",
        peer_factor: 1.0,
        title: "Attention forward + VJP against forward + backward",
        what: "kappa-attention's forward pass and weight VJP against tch's forward and autograd \
               backward, f64.",
        work: Some(Model {
            formula: "the forward's 6NDk + 4N²k flops (three projections, scores, weighted \
                      values) and the VJP's 6NDk + 8N²k, against the f64 GEMM limit",
            of: bounds::attention_forward_vjp_flops,
        }),
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_dense_workspace",
        peer: "autograd_rows_jacobian",
        peer_factor: 1.0,
        title: "Dense weight Jacobian against autograd, row by row",
        what: "kappa-attention's exact weight Jacobian into a reused `JacobianWorkspace` (forward \
               pass included) against the same Jacobian from N·k autograd backwards (small shape).",
        work: None,
    },
    Comparison {
        bench: "optim",
        group: "optim_f32",
        kappa: "muon_step",
        peer: "ns5_bare",
        peer_factor: 1.0,
        title: "Muon step against its bare Newton–Schulz products",
        what: "kappa-optim's Muon step (Keller's settings, f32 tensors) against the five bare \
               quintic steps it orthogonalizes with: what the step costs beyond msign.",
        work: Some(Model {
            formula: NS5,
            of: bounds::ns5_flops,
        }),
    },
    Comparison {
        bench: "optim",
        group: "optim_f32",
        kappa: "kappa_adamw",
        peer: "adamw_step",
        peer_factor: 1.0,
        title: "AdamW step against tch's",
        what: "kappa-optim's AdamW step (the fused kernel, `AdamW::step_tensors`) against tch's \
               `nn::AdamW` step on one f32 parameter of the shape.",
        work: Some(Model {
            formula: "28·m·n bytes: the step reads the parameter, the gradient and both \
                      moments and writes the parameter and both moments, 4 bytes each, against \
                      the triad bandwidth",
            of: bounds::adamw_bytes,
        }),
    },
];

/// The comparisons the benches record themselves (`kappa_benches::record`), as (bench, record
/// name, title): the page names those a run left out.
pub(crate) const PAIRED: &[(&str, &str, &str)] = &[
    (
        "optim",
        "muon_vs_torch",
        "Muon step against torch.optim.Muon",
    ),
    (
        "optimizer_api",
        "api_cost",
        "The optimizer API's step against the calls it makes",
    ),
    (
        "optimizer_api",
        "optimizer_vs_torch",
        "The whole-model optimizer step against torch.optim.Muon + torch.optim.AdamW",
    ),
    (
        "optimizer_api",
        "split_heads",
        "Split orthogonalization: a QKV weight's head blocks batched against one call each",
    ),
    (
        "manifolds",
        "optimizer_vs_msign_count",
        "Module-wise optimizers against their msign count",
    ),
    (
        "models",
        "gpt_vs_eager",
        "GPT training step against PyTorch eager",
    ),
    (
        "models",
        "conditioned_vs_baseline",
        "Conditioned training step against the baseline step",
    ),
    (
        "attention",
        "paired_ratios",
        "Attention's VJP against autograd, its Jacobian against jacrev",
    ),
    (
        "gemm",
        "products_vs_libtorch",
        "Products against libtorch's GEMM",
    ),
    (
        "nystrom",
        "nystrom_vs_exact",
        "Nyström attention against exact softmax attention",
    ),
    (
        "data_parallel",
        "ranks_vs_threads",
        "Data-parallel training: ranks against threads",
    ),
    (
        "sharded_muon",
        "sharded_vs_one_rank",
        "Muon sharded over two ranks against one rank",
    ),
];
