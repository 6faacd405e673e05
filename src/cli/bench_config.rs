//! What `wgpu-mha bench` measures: the named configurations and the `--config` spec parser.

use wgpu_mha::error::{Error, Result};
use wgpu_mha::model::config::AttentionConfig;

/// The most values one host tensor of a benchmark may hold.
pub const MAX_HOST_VALUES: u64 = 1 << 32;

/// Which seed module a configuration uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Classic,
    PerHead,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Classic => "classic",
            Variant::PerHead => "per_head",
        }
    }
}

/// One benchmark configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    pub name: String,
    pub variant: Variant,
    pub batch: usize,
    pub lq: usize,
    pub lk: usize,
    pub config: AttentionConfig,
}

impl BenchConfig {
    fn classic(name: &str, batch: usize, l: usize, d: usize, h: usize) -> Result<Self> {
        Ok(BenchConfig {
            name: name.into(),
            variant: Variant::Classic,
            batch,
            lq: l,
            lk: l,
            config: AttentionConfig::classic(d, h)?,
        })
    }

    fn per_head(
        name: &str,
        batch: usize,
        l: usize,
        e: usize,
        qk: usize,
        v: usize,
        h: usize,
    ) -> Result<Self> {
        Ok(BenchConfig {
            name: name.into(),
            variant: Variant::PerHead,
            batch,
            lq: l,
            lk: l,
            config: AttentionConfig::per_head(e, qk, v, h)?,
        })
    }

    /// Parses a custom shape:
    /// `classic:b=1,l=128,d=512,h=8` or `per_head:b=16,l=128,e=128,qk=256,v=512,h=8`;
    /// `lq=`/`lk=` may replace `l=` for different query and key lengths.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| Error::Misuse(format!("bad --config `{spec}`: {why}"));
        let (kind, rest) = spec
            .split_once(':')
            .ok_or_else(|| bad("expected `classic:b=..,l=..,d=..,h=..` or `per_head:b=..,l=..,e=..,qk=..,v=..,h=..`".into()))?;
        let mut values = std::collections::BTreeMap::new();
        for item in rest.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("`{item}` is not key=value")))?;
            let v: usize = v
                .trim()
                .parse()
                .map_err(|_| bad(format!("`{v}` is not a whole number")))?;
            values.insert(k.trim().to_string(), v);
        }
        let get = |k: &str| {
            values
                .get(k)
                .copied()
                .ok_or_else(|| bad(format!("missing `{k}=`")))
        };
        let l = values.get("l").copied();
        let lq = values
            .get("lq")
            .copied()
            .or(l)
            .ok_or_else(|| bad("missing `l=` (or `lq=` and `lk=`)".into()))?;
        let lk = values
            .get("lk")
            .copied()
            .or(l)
            .ok_or_else(|| bad("missing `l=` (or `lq=` and `lk=`)".into()))?;
        let batch = get("b")?;
        if batch == 0 || lq == 0 || lk == 0 {
            return Err(bad("b, l, lq and lk must be at least 1".into()));
        }
        let (variant, config) = match kind.trim() {
            "classic" => (
                Variant::Classic,
                AttentionConfig::classic(get("d")?, get("h")?)?,
            ),
            "per_head" | "per-head" | "perhead" => (
                Variant::PerHead,
                AttentionConfig::per_head(get("e")?, get("qk")?, get("v")?, get("h")?)?,
            ),
            other => {
                return Err(bad(format!(
                    "unknown variant `{other}` (classic or per_head)"
                )))
            }
        };
        let allowed: &[&str] = match variant {
            Variant::Classic => &["b", "l", "lq", "lk", "d", "h"],
            Variant::PerHead => &["b", "l", "lq", "lk", "e", "qk", "v", "h"],
        };
        if let Some(k) = values.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(format!("unknown key `{k}`")));
        }
        let bench = BenchConfig {
            name: spec.to_string(),
            variant,
            batch,
            lq,
            lk,
            config,
        };
        bench.check_host_memory().map_err(bad)?;
        Ok(bench)
    }

    /// The bench builds its inputs and reads its output on the host: refuse a
    /// shape whose tensors alone exceed [`MAX_HOST_VALUES`] instead of aborting on the
    /// allocation.
    fn check_host_memory(&self) -> std::result::Result<(), String> {
        let c = &self.config;
        let tensors = [
            ("the query input", [self.batch, self.lq, c.model_dim]),
            ("the key/value input", [self.batch, self.lk, c.key_dim]),
            ("the output", [self.batch, self.lq, c.output_dim()]),
        ];
        for (what, dims) in tensors {
            let values = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
            match values {
                Some(v) if v <= MAX_HOST_VALUES => {}
                _ => {
                    return Err(format!(
                        "{what} {dims:?} would exceed {MAX_HOST_VALUES} values (16 GiB)"
                    ))
                }
            }
        }
        Ok(())
    }
}

/// The named configurations (`--only NAME` picks one; `gemm` is the micro-benchmark).
pub fn named_configs() -> Result<Vec<BenchConfig>> {
    Ok(vec![
        BenchConfig::classic("classic-b1-l128", 1, 128, 512, 8)?,
        BenchConfig::classic("classic-b8-l512", 8, 512, 512, 8)?,
        BenchConfig::classic("classic-b1-l2048-d1024-h16", 1, 2048, 1024, 16)?,
        BenchConfig::per_head("per_head-b16-l128", 16, 128, 128, 256, 512, 8)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_and_per_head_specs_parse() {
        let c = BenchConfig::parse("classic:b=2,l=128,d=512,h=8").unwrap();
        assert_eq!(
            (c.variant, c.batch, c.lq, c.lk),
            (Variant::Classic, 2, 128, 128)
        );
        assert_eq!((c.config.model_dim, c.config.heads), (512, 8));
        let p = BenchConfig::parse("per_head:b=1,lq=3,lk=9,e=16,qk=8,v=4,h=2").unwrap();
        assert_eq!((p.variant, p.lq, p.lk), (Variant::PerHead, 3, 9));
        assert_eq!((p.config.qk_head_dim, p.config.v_head_dim), (8, 4));
    }

    #[test]
    fn sizes_of_one_parse_and_zero_does_not() {
        assert!(BenchConfig::parse("classic:b=1,l=1,d=1,h=1").is_ok());
        for bad in [
            "classic:b=0,l=1,d=1,h=1",
            "classic:b=1,l=0,d=1,h=1",
            "classic:b=1,l=1,d=0,h=1",
        ] {
            assert!(BenchConfig::parse(bad).is_err(), "{bad}");
        }
        // d must divide by h (3 heads of 4 fit 12, not 13).
        assert!(BenchConfig::parse("classic:b=1,l=1,d=12,h=3").is_ok());
        assert!(BenchConfig::parse("classic:b=1,l=1,d=13,h=3").is_err());
    }

    #[test]
    fn malformed_specs_are_misuse_errors_naming_the_problem() {
        let cases = [
            ("classic", "expected"),
            ("classic:b=1,l=8,d=8", "missing `h=`"),
            ("classic:b=1,d=8,h=2", "missing `l=`"),
            ("classic:b=1,l=8,d=8,h=2,e=3", "unknown key `e`"),
            ("classic:b=1e11,l=8,d=8,h=2", "not a whole number"),
            ("classic:b=1,l=8,d=8,h", "not key=value"),
            ("bert:b=1,l=8,d=8,h=2", "unknown variant"),
            ("classic:b=100000000000,l=8,d=8,h=2", "would exceed"),
            ("classic:b=1,l=100000000,d=512,h=8", "would exceed"),
        ];
        for (spec, says) in cases {
            match BenchConfig::parse(spec) {
                Err(Error::Misuse(m)) => assert!(m.contains(says), "{spec}: {m}"),
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    #[test]
    fn host_memory_is_checked_at_the_boundary() {
        // 2^32 values exactly is accepted, one row more is not.
        assert!(BenchConfig::parse("classic:b=1,lq=4194304,lk=1,d=1024,h=1").is_ok());
        assert!(BenchConfig::parse("classic:b=1,lq=4194305,lk=1,d=1024,h=1").is_err());
    }

    #[test]
    fn named_configs_are_valid_and_distinct() {
        let named = named_configs().unwrap();
        let mut names: Vec<&str> = named.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), named.len());
    }
}
