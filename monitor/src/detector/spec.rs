//! Detector specifications on the command line:
//! `fixed:timeout_ms=1400` or
//! `phi:model=normal,threshold=12,window=50,min_std_ms=250,pause_ms=0,first_interval_ms=500,max_interval_ms=2000,outage_factor=4`.
//! Omitted keys take `DetectorParams::DEFAULT`. Model-specific keys are each model's own
//! (`ModelSpec`, in `detector::models`): `alpha_ms` (`chen`, `bertier`; omitted, the model's
//! default) and `window_short` (`2w`; 1..=window, omitted and larger than `window`, it is taken
//! as `window`); `fixed` is a kind of its own, with `timeout_ms`.

use monitor_common::{maps::MAX_WINDOW, slot::MAX_OUTAGE_FACTOR};

use super::{
    model::{DetectorParams, Model},
    models::SpecKey,
};

/// The keys every `phi:` model takes; a model's own keys are its `ModelSpec`'s.
const COMMON_KEYS: [&str; 8] = [
    "model",
    "threshold",
    "window",
    "min_std_ms",
    "pause_ms",
    "first_interval_ms",
    "max_interval_ms",
    "outage_factor",
];

/// The models named by `phi:model=NAME`: those without a spec kind of their own.
fn phi_models() -> impl Iterator<Item = Model> {
    Model::ALL
        .into_iter()
        .filter(|m| m.spec().own_kind.is_none())
}

/// The own key `name` of one of `models`.
fn own_key(models: impl IntoIterator<Item = Model>, name: &str) -> Option<&'static SpecKey> {
    models
        .into_iter()
        .flat_map(|m| m.spec().keys)
        .find(|k| k.name == name)
}

/// Parses a SPEC into parameters; the error names the offending key or value.
pub fn parse_spec(spec: &str) -> Result<DetectorParams, String> {
    let spec = spec.trim();
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut params = DetectorParams::DEFAULT;
    let mut allowed: Vec<&str> = Vec::new();
    if kind == "phi" {
        allowed.extend(COMMON_KEYS);
        for key in phi_models().flat_map(|m| m.spec().keys) {
            if !allowed.contains(&key.name) {
                allowed.push(key.name);
            }
        }
    } else {
        let own = Model::ALL.into_iter().find_map(|m| {
            let (own_kind, common) = m.spec().own_kind?;
            (own_kind == kind).then_some((m, common))
        });
        let Some((model, common)) = own else {
            let kinds: Vec<String> = ["phi"]
                .into_iter()
                .chain(Model::ALL.iter().filter_map(|m| Some(m.spec().own_kind?.0)))
                .map(|k| format!("`{k}:`"))
                .collect();
            return Err(format!(
                "{kind:?}: a detector spec starts with {}",
                kinds.join(" or ")
            ));
        };
        params.model = model;
        allowed.extend(model.spec().keys.iter().map(|k| k.name));
        allowed.extend(common);
    }
    let mut given: Vec<&str> = Vec::new();
    for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?}: expected key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        let Some(&key) = allowed.iter().find(|&&k| k == key) else {
            return Err(format!(
                "unknown key {key:?} for `{kind}` (known: {})",
                allowed.join(", ")
            ));
        };
        given.push(key);
        match key {
            "model" => {
                params.model = match Model::from_name(value) {
                    Some(model) if model.spec().own_kind.is_none() => model,
                    _ => {
                        let names: Vec<&str> = phi_models().map(|m| m.name()).collect();
                        return Err(format!("model {value:?}: one of {}", names.join(", ")));
                    }
                }
            }
            "outage_factor" => params.outage_factor = parse_outage_factor(value)?,
            "threshold" => params.threshold = positive(key, value)?,
            "window" => {
                let w: u32 = value
                    .parse()
                    .map_err(|_| format!("window {value:?} is not an integer"))?;
                if !(2..=MAX_WINDOW as u32).contains(&w) {
                    return Err(format!(
                        "window must be 2..={MAX_WINDOW} (the kernel's limit), got {w}"
                    ));
                }
                params.window = w;
            }
            "min_std_ms" => params.min_std_ms = non_negative(key, value)?,
            "pause_ms" => params.pause_ms = non_negative(key, value)?,
            "first_interval_ms" => params.first_interval_ms = non_negative(key, value)?,
            "max_interval_ms" => params.max_interval_ms = Some(positive(key, value)?),
            own => {
                let key = own_key(Model::ALL, own).expect("checked against `allowed`");
                (key.parse)(&mut params, value)?;
            }
        }
    }
    // Model-specific keys, checked once the model is known (keys come in any order).
    let model = params.model;
    for &key in allowed.iter().filter(|k| given.contains(k)) {
        let common = COMMON_KEYS.contains(&key) || model.spec().own_kind.is_some();
        if !common && own_key([model], key).is_none() {
            let owners: Vec<String> = phi_models()
                .filter(|&m| own_key([m], key).is_some())
                .map(|m| format!("model={}", m.name()))
                .collect();
            return Err(format!(
                "{key} applies to {}, not {}",
                owners.join(" and "),
                model.name()
            ));
        }
    }
    (model.spec().finish)(&mut params, &given)?;
    Ok(params)
}

/// Parses an outage factor: 0 (off) or 2..=MAX_OUTAGE_FACTOR.
pub fn parse_outage_factor(value: &str) -> Result<u32, String> {
    let k: u32 = value
        .parse()
        .map_err(|_| format!("outage_factor {value:?} is not a whole number"))?;
    if k == 1 || k > MAX_OUTAGE_FACTOR {
        return Err(format!(
            "outage_factor must be 0 (off) or 2..={MAX_OUTAGE_FACTOR}, got {k}"
        ));
    }
    Ok(k)
}

/// The canonical spec of `params`: every key, so a report says exactly what ran.
pub fn format_spec(params: &DetectorParams) -> String {
    let spec = params.model.spec();
    let own = (spec.format)(params);
    if let Some((kind, _)) = spec.own_kind {
        return format!("{kind}:{}", own.join(","));
    }
    let mut s = format!(
        "phi:model={},threshold={},window={},min_std_ms={},pause_ms={},first_interval_ms={},outage_factor={}",
        params.model.name(),
        params.threshold,
        params.window,
        params.min_std_ms,
        params.pause_ms,
        params.first_interval_ms,
        params.outage_factor
    );
    if let Some(max) = params.max_interval_ms {
        s.push_str(&format!(",max_interval_ms={max}"));
    }
    for part in own {
        s.push(',');
        s.push_str(&part);
    }
    s
}

fn number(key: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("{key}={value:?} is not a finite number")),
    }
}

pub(crate) fn positive(key: &str, value: &str) -> Result<f64, String> {
    let v = number(key, value)?;
    if v <= 0.0 {
        return Err(format!("{key} must be greater than 0, got {v}"));
    }
    Ok(v)
}

pub(crate) fn non_negative(key: &str, value: &str) -> Result<f64, String> {
    let v = number(key, value)?;
    if v < 0.0 {
        return Err(format!("{key} must not be negative, got {v}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_examples() {
        let f = parse_spec("fixed:timeout_ms=1400").unwrap();
        assert_eq!((f.model, f.timeout_ms), (Model::Fixed, 1400.0));
        let p = parse_spec(
            "phi:model=akka,threshold=12,window=50,min_std_ms=250,pause_ms=0,first_interval_ms=500,max_interval_ms=2000",
        )
        .unwrap();
        assert_eq!(p.model, Model::Akka);
        assert_eq!((p.threshold, p.window, p.min_std_ms), (12.0, 50, 250.0));
        assert_eq!(
            (p.pause_ms, p.first_interval_ms, p.max_interval_ms),
            (0.0, 500.0, Some(2000.0))
        );
        assert_eq!(parse_spec("phi").unwrap(), DetectorParams::DEFAULT);
        assert_eq!(parse_spec("phi:").unwrap(), DetectorParams::DEFAULT);
    }

    #[test]
    fn round_trips_through_the_canonical_form() {
        for spec in [
            "phi:model=exponential,threshold=3,max_interval_ms=2000",
            "fixed:timeout_ms=250",
            "phi:model=chen",
            "phi:model=chen,alpha_ms=37.5,window=64,pause_ms=10",
            "phi:model=bertier",
            "phi:model=bertier,alpha_ms=12,first_interval_ms=0",
            "phi:model=empirical,threshold=4,min_std_ms=5,window=32",
            "phi:model=2w",
            "phi:model=2w,window_short=1,window=16,threshold=3",
            "phi:model=2w,window=3",
        ] {
            let p = parse_spec(spec).unwrap();
            assert_eq!(parse_spec(&format_spec(&p)).unwrap(), p, "{spec}");
        }
    }

    #[test]
    fn model_specific_keys() {
        // Defaults by model; a spec says what ran.
        let chen = parse_spec("phi:model=chen").unwrap();
        assert_eq!((chen.alpha_ms, chen.alpha()), (Some(150.0), 150.0));
        assert!(format_spec(&chen).contains(",alpha_ms=150"));
        let bertier = parse_spec("phi:alpha_ms=25,model=bertier").unwrap();
        assert_eq!(bertier.alpha_ms, Some(25.0), "keys in any order");
        assert_eq!(parse_spec("phi:model=bertier").unwrap().alpha(), 0.0);
        let two = parse_spec("phi:model=2w,window_short=8").unwrap();
        assert_eq!((two.model, two.window_short), (Model::TwoWindows, 8));
        assert!(format_spec(&two).ends_with(",window_short=8"));
        // An implicit short window never exceeds the long one.
        assert_eq!(parse_spec("phi:model=2w,window=3").unwrap().window_short, 3);
        assert_eq!(
            parse_spec("phi:model=empirical").unwrap().model,
            Model::Empirical
        );
        // Keys of other models are not printed.
        assert!(!format_spec(&DetectorParams::DEFAULT).contains("alpha_ms"));
        assert!(!format_spec(&DetectorParams::DEFAULT).contains("window_short"));
        // Parameters built without the spec (`monitor run --model chen`) print the margin
        // in effect, which parses back to the same detector.
        let flags = DetectorParams {
            model: Model::Chen,
            ..DetectorParams::DEFAULT
        };
        assert_eq!(parse_spec(&format_spec(&flags)).unwrap().alpha(), 150.0);
        for (spec, expected) in [
            ("phi:model=normal,alpha_ms=5", "alpha_ms applies to"),
            ("phi:model=chen,alpha_ms=-1", "not be negative"),
            ("phi:model=2w,window=8,window_short=9", "1..=window (8)"),
            ("phi:model=2w,window_short=0", "1..=window"),
            ("phi:model=chen,window_short=4", "window_short applies to"),
            ("phi:model=twowindows", "one of normal"),
        ] {
            let err = parse_spec(spec).expect_err(spec);
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }

    /// A model added to the registry is reachable from a spec, and its canonical spec parses
    /// back to the same detector.
    #[test]
    fn every_registered_model_round_trips() {
        for model in Model::ALL {
            let params = DetectorParams {
                model,
                ..DetectorParams::DEFAULT
            };
            let spec = format_spec(&params);
            let back = parse_spec(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(back.model, model, "{spec}");
            assert_eq!(format_spec(&back), spec);
        }
    }

    #[test]
    fn errors_name_the_problem() {
        for (spec, expected) in [
            ("timeout:ms=3", "starts with"),
            ("phi:model=gauss", "model \"gauss\""),
            ("phi:threshold=-1", "greater than 0"),
            ("phi:threshold=abc", "not a finite number"),
            ("phi:window=1000", "2..=128"),
            ("phi:timeout_ms=5", "unknown key"),
            ("fixed:threshold=5", "unknown key"),
            ("phi:threshold", "key=value"),
            ("phi:pause_ms=-3", "not be negative"),
            ("phi:outage_factor=1", "0 (off) or 2..="),
            ("phi:outage_factor=2.5", "whole number"),
            ("phi:model=fixed", "one of normal"),
            ("phi:threshold=inf", "not a finite number"),
        ] {
            let err = parse_spec(spec).expect_err(spec);
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }
}
