//! The error contract: typed errors, nothing modified on error.

use super::common::*;
use kappa_optim::manifold::*;
use kappa_optim::*;
use ndarray::Array2;

#[test]
fn non_finite_gradients_and_shapes_are_typed_errors() {
    let muon = Muon::new(MuonConfig::keller()).unwrap();
    let mut w = gaussian(6, 4, 1);
    let w0 = w.clone();
    let mut g = gaussian(6, 4, 2);
    g[[2, 3]] = f64::NAN;
    let mut st = MuonState::new();
    match muon.step(&mut w, &g, &mut st) {
        Err(OptimError::Input(InputError::NonFinite {
            arg: "grad",
            row: 2,
            col: 3,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }
    let g2 = gaussian(4, 6, 2);
    assert!(matches!(
        muon.step(&mut w, &g2, &mut st),
        Err(OptimError::Input(InputError::ShapeMismatch {
            arg: "grad",
            ..
        }))
    ));
    assert_eq!(w, w0);
    assert_eq!(st.steps(), 0);
    // A state from another parameter.
    muon.step(&mut w, &gaussian(6, 4, 3), &mut st).unwrap();
    let mut other = gaussian(5, 4, 1);
    assert!(matches!(
        muon.step(&mut other, &gaussian(5, 4, 3), &mut st),
        Err(OptimError::Input(InputError::ShapeMismatch {
            arg: "state",
            ..
        }))
    ));
}

/// An empty matrix is an input error of kappa-optim too, with kappa-linalg's message.
#[test]
fn empty_matrices_are_input_errors() {
    let muon = Muon::new(MuonConfig::keller()).unwrap();
    let mut w = Array2::<f64>::zeros((0, 4));
    let e = muon
        .step(&mut w, &Array2::zeros((0, 4)), &mut MuonState::new())
        .unwrap_err();
    assert!(
        matches!(
            e,
            OptimError::Input(InputError::Empty {
                arg: "w",
                rows: 0,
                cols: 4
            })
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "argument `w` is empty (shape 0×4); a non-empty matrix is required"
    );
    let e = msign(
        &Array2::<f64>::zeros((3, 0)),
        Msign::Exact,
        Precision::Native,
    )
    .unwrap_err();
    assert!(
        matches!(e, OptimError::Input(InputError::Empty { arg: "x", .. })),
        "{e:?}"
    );
}

#[test]
fn invalid_settings_are_rejected() {
    assert!(Muon::new(MuonConfig {
        lr: f64::NAN,
        ..MuonConfig::keller()
    })
    .is_err());
    let mut m = Momentum::keller();
    m.beta = 1.0;
    assert!(Muon::new(MuonConfig {
        momentum: m,
        ..MuonConfig::keller()
    })
    .is_err());
    assert!(Muon::new(MuonConfig {
        msign: Msign::PolarExpress { steps: 0 },
        ..MuonConfig::keller()
    })
    .is_err());
    let mut d = DualAscent::paper();
    d.steps = 0;
    assert!(ManifoldMuon::new(ManifoldMuonConfig {
        dual: d,
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    })
    .is_err());
    // ndarray computes in its own type: bf16 is a typed error, not a panic.
    let muon = Muon::new(MuonConfig {
        precision: Precision::Bf16,
        ..MuonConfig::keller()
    })
    .unwrap();
    let mut w = gaussian(3, 3, 1);
    assert!(matches!(
        muon.step(&mut w, &gaussian(3, 3, 2), &mut MuonState::new()),
        Err(OptimError::Input(InputError::InvalidArgument {
            arg: "precision",
            ..
        }))
    ));
}

#[test]
fn a_matrix_off_its_manifold_is_reported_with_its_violation() {
    let opt = ManifoldMuon::new(ManifoldMuonConfig::paper(Manifold::Stiefel)).unwrap();
    let mut w = gaussian(48, 16, 1) * 0.02;
    let w0 = w.clone();
    match opt.step(&mut w, &gaussian(48, 16, 2), &mut ManifoldState::new()) {
        Err(OptimError::NotOnManifold {
            manifold: "Stiefel",
            violation,
            tol,
        }) => {
            // Not a rounding tolerance: 0.02·Gaussian has WᵀW ≈ 0.02²·48·I, so the violation
            // ‖WᵀW − I‖_F/√n ≈ 1 − 0.0192 ≈ 0.98, far above manifold_tol (0.05) and 0.5.
            assert!(violation > tol && violation > 0.5, "{violation}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w, w0);
}

#[test]
fn a_diverging_dual_ascent_is_reported_not_applied() {
    // Entries ~1e-4 with α = 0.1 (paper settings, unnormalized): the ascent diverges (docs/optim.md, "Traps").
    let cfg = ManifoldMuonConfig {
        msign: Msign::Exact,
        momentum: Momentum::none(),
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    };
    let opt = ManifoldMuon::new(cfg).unwrap();
    let mut w = orthonormal(96, 32, 1);
    let w0 = w.clone();
    let g = gaussian(96, 32, 2) * 1e-4;
    let mut st = ManifoldState::new();
    match opt.step(&mut w, &g, &mut st) {
        Err(e @ OptimError::DualAscentDiverged { .. }) => {
            let OptimError::DualAscentDiverged {
                violation,
                initial_violation,
                ref remedy,
                ..
            } = e
            else {
                unreachable!()
            };
            // The divergence test's own threshold (dual.rs, "Traps": divergence_factor = 2).
            assert!(violation > DualAscent::paper().divergence_factor * initial_violation);
            // The message says what to change, and to what.
            let msg = e.to_string();
            assert!(
                msg.contains(remedy.as_str()) && msg.contains("dual.normalize = Some("),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w, w0);
    assert_eq!(st.steps(), 0);
    assert!(st.buffer().is_none());
    // With OnDivergence::Apply the step is applied and flagged.
    let mut dual = DualAscent::paper();
    dual.on_divergence = OnDivergence::Apply;
    let opt = ManifoldMuon::new(ManifoldMuonConfig { dual, ..cfg }).unwrap();
    let step = opt.step(&mut w, &g, &mut st).unwrap();
    assert!(step.dual.diverged);
    // A band, not a rounding tolerance: the diverged ascent's descent is far below ‖G‖_*
    // (dual.rs, "Traps": 96×32, entries 1e-4: descent ratio 0.08).
    assert!(step.dual.descent_ratio.unwrap() < 0.5);
    // The advice names the settings as a user writes them, with values for this input.
    let remedy = DualAscent::paper().divergence_remedy(&step.dual);
    for setting in [
        "dual.normalize = Some(0.3)",
        "dual.alpha = ",
        "dual.on_divergence = OnDivergence::Apply",
    ] {
        assert!(remedy.contains(setting), "{setting} missing: {remedy}");
    }
    // The suggested α works on this gradient (it is the normalized ascent, in G's units).
    let alpha: f64 = remedy
        .split("dual.alpha = ")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .and_then(|v| v.parse().ok())
        .expect("a number after `dual.alpha = `");
    let mut dual = DualAscent::paper();
    dual.alpha = alpha;
    let fixed = ManifoldMuon::new(ManifoldMuonConfig { dual, ..cfg }).unwrap();
    let (_, r) = fixed.direction(&w0, &g).unwrap();
    assert!(!r.diverged && r.violation < 1e-3, "α = {alpha}: {r:?}");
    // Already normalized: the advice is a smaller α or the projection.
    let remedy = DualAscent::paper()
        .normalized()
        .divergence_remedy(&step.dual);
    assert!(remedy.contains("dual.alpha = ") && remedy.contains("dual.project = true"));
    // Normalizing the gradient fixes it.
    let opt = ManifoldMuon::new(ManifoldMuonConfig {
        dual: DualAscent::paper().normalized(),
        ..cfg
    })
    .unwrap();
    let mut w = w0.clone();
    let step = opt.step(&mut w, &g, &mut ManifoldState::new()).unwrap();
    // Tangency when well scaled (docs/optim.md property 4: ≤ 1e-3 for tall Gaussian problems).
    assert!(!step.dual.diverged && step.dual.violation < 1e-3);
    let _: Option<&Array2<f64>> = st.buffer();
}
