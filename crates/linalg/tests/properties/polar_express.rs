//! The Polar Express generator: the published table, the predicted bands, bad input.

use super::common::*;
use kappa_linalg::{NsSchedule, PolarExpressSpec, POLAR_EXPRESS_COEFFICIENTS};

#[test]
fn scratch_print() {
    for steps in [8usize, 10] {
        let d = PolarExpressSpec::paper(steps).design().unwrap();
        let sched = NsSchedule::polar_express(steps).unwrap();
        for (t, p) in d.polynomials.iter().enumerate() {
            let q = POLAR_EXPRESS_COEFFICIENTS[t.min(7)];
            println!("{t}: {:?} d=({:e},{:e},{:e})  sched d=({:e},{:e},{:e})", p,
              (p.a-q.a)/q.a, (p.b-q.b)/q.b, (p.c-q.c)/q.c,
              d.schedule.steps[t].a - sched.steps[t].a, d.schedule.steps[t].b - sched.steps[t].b, d.schedule.steps[t].c - sched.steps[t].c);
        }
        println!("intervals {:?}", d.design_intervals);
        println!("errors {:?}", d.errors());
    }
    let _ = U64;
}
