//! [`Optimizer::state_dict`] and [`Optimizer::load_state_dict`] (the key table is in the
//! module docs of [`super`]).

use std::collections::{HashMap, HashSet};

use tch::{Device, Kind, Tensor};

use super::group::{Group, States};
use super::Optimizer;
use crate::error::{libtorch, OptimError, Result};
use crate::{AdamWState, MomentumState, MuonState};

fn key(param: &str, field: &str) -> String {
    format!("state/{param}/{field}")
}

fn i64s(values: &[u64]) -> Tensor {
    let v: Vec<i64> = values.iter().map(|&x| x as i64).collect();
    Tensor::from_slice(&v)
}

impl Optimizer {
    /// The optimizer's state as named tensors (module docs, "State"): shallow clones of the
    /// moments, on their device; [`Optimizer::save`] writes them.
    pub fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![("step".to_string(), i64s(&[self.steps]))];
        for g in &self.groups {
            out.push((format!("lr/{}", g.name), Tensor::from_slice(&[g.lr])));
            for (i, name) in g.names.iter().enumerate() {
                match &g.states {
                    States::None => {}
                    States::AdamW(_, states) => {
                        let s = &states[i];
                        out.push((key(name, "steps"), i64s(&[s.steps()])));
                        if let (Some(m), Some(v)) = (s.exp_avg(), s.exp_avg_sq()) {
                            out.push((key(name, "exp_avg"), m.shallow_clone()));
                            out.push((key(name, "exp_avg_sq"), v.shallow_clone()));
                        }
                    }
                    States::Muon(_, states) => {
                        let momenta: Vec<_> = states[i].iter().map(MuonState::momentum).collect();
                        push_momenta(&mut out, name, &momenta);
                        for (b, s) in states[i].iter().enumerate() {
                            if let Some(v) = s.second_moment() {
                                out.push((
                                    key(name, &format!("second/{b}")),
                                    Tensor::from_slice(v),
                                ));
                            }
                        }
                    }
                    States::Manifold(_, states) => {
                        let momenta: Vec<_> = states[i].iter().collect();
                        push_momenta(&mut out, name, &momenta);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Loads a state [`Optimizer::state_dict`] returned (from this optimizer's groups, or the
    /// same groups built again): every key is checked first, and on any error nothing changes.
    ///
    /// Errors ([`OptimError::State`], naming the key): a key missing or naming no parameter or
    /// group; a tensor of the wrong size, kind or number of blocks, or with non-finite values; a
    /// block with steps but no momentum.
    pub fn load_state_dict(&mut self, saved: &HashMap<String, Tensor>) -> Result<()> {
        let mut reader = Reader {
            saved,
            used: HashSet::new(),
        };
        let steps = reader.count("step", 1)?[0];
        let mut lrs = Vec::new();
        let mut loaded = Vec::new();
        for g in &self.groups {
            let lr_key = format!("lr/{}", g.name);
            let lr = reader.rate(&lr_key)?;
            if !(lr.is_finite() && lr >= 0.0) {
                return Err(state_err(&lr_key, format!("{lr} is not a learning rate")));
            }
            lrs.push(lr);
            loaded.push(reader.group(g)?);
        }
        if let Some(k) = saved.keys().find(|k| !reader.used.contains(k.as_str())) {
            return Err(state_err(
                k,
                "names no parameter or group of this optimizer".into(),
            ));
        }
        for ((g, lr), states) in self.groups.iter_mut().zip(lrs).zip(loaded) {
            g.lr = lr;
            g.states = states;
        }
        self.steps = steps;
        Ok(())
    }
}

fn push_momenta(out: &mut Vec<(String, Tensor)>, name: &str, momenta: &[&MomentumState<Tensor>]) {
    let steps: Vec<u64> = momenta.iter().map(|m| m.steps()).collect();
    out.push((key(name, "steps"), i64s(&steps)));
    for (b, m) in momenta.iter().enumerate() {
        if let Some(buffer) = m.buffer() {
            out.push((key(name, &format!("momentum/{b}")), buffer.shallow_clone()));
        }
    }
}

fn state_err(key: &str, reason: String) -> OptimError {
    OptimError::State {
        key: key.to_string(),
        reason,
    }
}

/// Reads keys from a saved state, remembering which were read.
struct Reader<'a> {
    saved: &'a HashMap<String, Tensor>,
    used: HashSet<&'a str>,
}

impl<'a> Reader<'a> {
    fn get(&mut self, key: &str) -> Result<&'a Tensor> {
        let (k, t) = self
            .saved
            .get_key_value(key)
            .ok_or_else(|| state_err(key, "is missing".into()))?;
        self.used.insert(k.as_str());
        // Checked once here, so the readers below may ask a tensor's kind without a panic.
        super::dense("state", t).map_err(|e| state_err(key, e.to_string()))?;
        Ok(t)
    }

    fn optional(&mut self, key: &str) -> Option<&'a Tensor> {
        self.get(key).ok()
    }

    /// `n` step counts (an i64 vector).
    fn count(&mut self, key: &str, n: usize) -> Result<Vec<u64>> {
        let t = self.get(key)?;
        if t.kind() != Kind::Int64 || t.size() != [n as i64] {
            let found = format!("{:?} {:?}", t.kind(), t.size());
            return Err(state_err(
                key,
                format!("expected {n} Int64 step count(s), found {found}"),
            ));
        }
        let cpu = t.f_to_device(Device::Cpu).map_err(libtorch("steps"))?;
        let v: Vec<i64> = Vec::try_from(&cpu).map_err(libtorch("steps"))?;
        v.into_iter()
            .map(|x| {
                u64::try_from(x).map_err(|_| state_err(key, format!("a negative step count {x}")))
            })
            .collect()
    }

    /// A learning rate (a one-entry f64 vector).
    fn rate(&mut self, key: &str) -> Result<f64> {
        let t = self.get(key)?;
        if t.kind() != Kind::Double || t.size() != [1] {
            let found = format!("{:?} {:?}", t.kind(), t.size());
            return Err(state_err(
                key,
                format!("expected one Double learning rate, found {found}"),
            ));
        }
        t.f_double_value(&[0]).map_err(libtorch("lr"))
    }

    /// A moment of parameter `p`'s block `like`: same size and kind, finite; copied onto its
    /// device.
    fn moment(&mut self, key: &str, like: &Tensor) -> Result<Tensor> {
        let t = self.get(key)?;
        if t.size() != like.size() || t.kind() != like.kind() {
            let reason = format!(
                "{:?} {:?}, expected {:?} {:?} (its parameter's block)",
                t.kind(),
                t.size(),
                like.kind(),
                like.size()
            );
            return Err(state_err(key, reason));
        }
        let mut copy = like.f_empty_like().map_err(libtorch("state"))?;
        copy.f_copy_(t).map_err(libtorch("state"))?;
        if !super::finite(&copy)? {
            return Err(state_err(key, "has a NaN or ±∞ entry".into()));
        }
        Ok(copy)
    }

    /// The momentum states of parameter `name`'s blocks `blocks`.
    fn momenta(&mut self, name: &str, blocks: &[Tensor]) -> Result<Vec<MomentumState<Tensor>>> {
        let steps_key = key(name, "steps");
        let steps = self.count(&steps_key, blocks.len())?;
        let mut out = Vec::with_capacity(blocks.len());
        for (b, (block, n)) in blocks.iter().zip(steps).enumerate() {
            let k = key(name, &format!("momentum/{b}"));
            let buffer = match self.saved.contains_key(&k) {
                true => Some(self.moment(&k, block)?),
                false if n > 0 => return Err(state_err(&k, format!("is missing after {n} steps"))),
                false => None,
            };
            out.push(MomentumState::from_parts(buffer, n));
        }
        Ok(out)
    }

    /// NorMuon's second moment of a block, if saved.
    fn second(&mut self, name: &str, b: usize) -> Result<Option<Vec<f64>>> {
        let k = key(name, &format!("second/{b}"));
        let Some(t) = self.optional(&k) else {
            return Ok(None);
        };
        let t = (t.f_to_kind(Kind::Double))
            .and_then(|t| t.f_to_device(Device::Cpu))
            .map_err(libtorch("second"))?;
        let v: Vec<f64> = Vec::try_from(&t).map_err(libtorch("second"))?;
        if v.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(state_err(&k, "has a negative or non-finite entry".into()));
        }
        Ok(Some(v))
    }

    /// The states of group `g`, read and checked.
    fn group(&mut self, g: &Group) -> Result<States> {
        let block_views = |i: usize| -> Result<Vec<Tensor>> {
            let (stack, _) = g.layouts[i].stack(&g.params[i], "w")?;
            g.layouts[i].views(&stack, "w")
        };
        Ok(match &g.states {
            States::None => States::None,
            States::AdamW(adamw, _) => {
                let mut states = Vec::new();
                for (name, p) in g.names.iter().zip(&g.params) {
                    let n = self.count(&key(name, "steps"), 1)?[0];
                    let (a, b) = (key(name, "exp_avg"), key(name, "exp_avg_sq"));
                    let moments = match (self.saved.contains_key(&a), self.saved.contains_key(&b)) {
                        (true, true) => Some((self.moment(&a, p)?, self.moment(&b, p)?)),
                        (false, false) if n == 0 => None,
                        (false, _) => return Err(state_err(&a, "is missing".into())),
                        (true, false) => return Err(state_err(&b, "is missing".into())),
                    };
                    states.push(AdamWState::from_parts(moments, n));
                }
                States::AdamW(adamw.clone(), states)
            }
            States::Muon(muon, _) => {
                let mut states = Vec::new();
                for (i, name) in g.names.iter().enumerate() {
                    let momenta = self.momenta(name, &block_views(i)?)?;
                    let blocks = momenta
                        .into_iter()
                        .enumerate()
                        .map(|(b, m)| Ok(MuonState::from_momentum(m, self.second(name, b)?)))
                        .collect::<Result<Vec<_>>>()?;
                    states.push(blocks);
                }
                States::Muon(muon.clone(), states)
            }
            States::Manifold(opt, _) => {
                let mut states = Vec::new();
                for (i, name) in g.names.iter().enumerate() {
                    states.push(self.momenta(name, &block_views(i)?)?);
                }
                States::Manifold(opt.clone(), states)
            }
        })
    }
}
