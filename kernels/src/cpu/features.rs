//! The one CPU feature detector: what the CPU has, detected once, and the level the kernels
//! may use, capped by `KERNELS_CPU_LEVEL`.
//!
//! Every kernel family picks its implementation from an [`Isa`]: the public entry points use
//! [`cpu_isa`], and the tests force each level the CPU can run. An [`Isa`] can only be made for
//! a level this CPU runs, so a kernel holding one may use that level's instructions.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that caps the level (`scalar`, `avx2`, `avxvnni`, `avx512`,
/// `avx512vnni`); unset or empty means the best level the CPU has.
pub const CPU_LEVEL_VAR: &str = "KERNELS_CPU_LEVEL";

/// Instruction-set levels the kernels are written for, in the order a cap counts them: a cap
/// at one level allows the features of every level up to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuLevel {
    /// Portable Rust loops (any target).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 and AVX-VNNI (256-bit integer dot products).
    AvxVnni,
    /// AVX2 and AVX-512 F/BW/VL.
    Avx512,
    /// AVX-512 F/BW/VL and AVX-512 VNNI.
    Avx512Vnni,
}

impl CpuLevel {
    /// Every level, lowest first.
    pub const ALL: [CpuLevel; 5] = [
        CpuLevel::Scalar,
        CpuLevel::Avx2,
        CpuLevel::AvxVnni,
        CpuLevel::Avx512,
        CpuLevel::Avx512Vnni,
    ];

    /// The name `KERNELS_CPU_LEVEL` takes.
    pub const fn name(self) -> &'static str {
        match self {
            CpuLevel::Scalar => "scalar",
            CpuLevel::Avx2 => "avx2",
            CpuLevel::AvxVnni => "avxvnni",
            CpuLevel::Avx512 => "avx512",
            CpuLevel::Avx512Vnni => "avx512vnni",
        }
    }

    /// The level named `name` (as [`CpuLevel::name`] writes it).
    pub fn parse(name: &str) -> Option<CpuLevel> {
        CpuLevel::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The features this level needs.
    const fn needs(self) -> CpuFeatures {
        let avx2 = CpuFeatures {
            avx2: true,
            fma: true,
            f16c: true,
            ..CpuFeatures::NONE
        };
        let avx512 = CpuFeatures {
            avx512f: true,
            avx512bw: true,
            avx512vl: true,
            ..avx2
        };
        match self {
            CpuLevel::Scalar => CpuFeatures::NONE,
            CpuLevel::Avx2 => avx2,
            CpuLevel::AvxVnni => CpuFeatures {
                avxvnni: true,
                ..avx2
            },
            CpuLevel::Avx512 => avx512,
            CpuLevel::Avx512Vnni => CpuFeatures {
                avx512vnni: true,
                ..avx512
            },
        }
    }

    /// Whether this CPU runs the level (whatever the cap says).
    pub fn available(self) -> bool {
        detected().contains(self.needs())
    }
}

impl fmt::Display for CpuLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The x86 features the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avxvnni: bool,
}

impl CpuFeatures {
    const NONE: CpuFeatures = CpuFeatures {
        avx2: false,
        fma: false,
        f16c: false,
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        avx512vnni: false,
        avxvnni: false,
    };

    /// What this CPU has (not cached: [`cpu_features`] is).
    fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            CpuFeatures {
                avx2: has!("avx2"),
                fma: has!("fma"),
                f16c: has!("f16c"),
                avx512f: has!("avx512f"),
                avx512bw: has!("avx512bw"),
                avx512vl: has!("avx512vl"),
                avx512vnni: has!("avx512vnni"),
                avxvnni: has!("avxvnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuFeatures::NONE
    }

    fn contains(self, other: CpuFeatures) -> bool {
        self.intersect(other) == other
    }

    fn intersect(self, o: CpuFeatures) -> CpuFeatures {
        CpuFeatures {
            avx2: self.avx2 && o.avx2,
            fma: self.fma && o.fma,
            f16c: self.f16c && o.f16c,
            avx512f: self.avx512f && o.avx512f,
            avx512bw: self.avx512bw && o.avx512bw,
            avx512vl: self.avx512vl && o.avx512vl,
            avx512vnni: self.avx512vnni && o.avx512vnni,
            avxvnni: self.avxvnni && o.avxvnni,
        }
    }

    fn union(self, o: CpuFeatures) -> CpuFeatures {
        CpuFeatures {
            avx2: self.avx2 || o.avx2,
            fma: self.fma || o.fma,
            f16c: self.f16c || o.f16c,
            avx512f: self.avx512f || o.avx512f,
            avx512bw: self.avx512bw || o.avx512bw,
            avx512vl: self.avx512vl || o.avx512vl,
            avx512vnni: self.avx512vnni || o.avx512vnni,
            avxvnni: self.avxvnni || o.avxvnni,
        }
    }

    /// The features a cap at `level` allows: those of every level up to it.
    fn allowed_by(level: CpuLevel) -> CpuFeatures {
        CpuLevel::ALL
            .into_iter()
            .filter(|&l| l <= level)
            .fold(CpuFeatures::NONE, |acc, l| acc.union(l.needs()))
    }

    /// The highest level these features run.
    fn best_level(self) -> CpuLevel {
        CpuLevel::ALL
            .into_iter()
            .rev()
            .find(|l| self.contains(l.needs()))
            .unwrap_or(CpuLevel::Scalar)
    }
}

/// What this CPU has, detected once.
fn detected() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(CpuFeatures::detect)
}

/// The features the kernels use here: what the CPU has, less what `KERNELS_CPU_LEVEL` caps
/// off. Detected once.
pub fn cpu_features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let cap = std::env::var(CPU_LEVEL_VAR).ok();
        capped(detected(), cap.as_deref())
    })
}

/// `features` less what the cap value `cap` (the variable's value, if set) takes off. An
/// unknown value is reported and ignored.
fn capped(features: CpuFeatures, cap: Option<&str>) -> CpuFeatures {
    let cap = cap.map(str::trim).filter(|v| !v.is_empty());
    let Some(value) = cap else {
        return features;
    };
    match CpuLevel::parse(&value.to_ascii_lowercase()) {
        Some(level) => features.intersect(CpuFeatures::allowed_by(level)),
        None => {
            let known: Vec<&str> = CpuLevel::ALL.iter().map(|l| l.name()).collect();
            tracing::warn!(
                variable = CPU_LEVEL_VAR,
                value,
                known = %known.join("|"),
                "unknown CPU level ignored: the kernels use the best level this CPU has"
            );
            features
        }
    }
}

/// A CPU level this machine can run: the only ways to get one check the CPU, so a kernel
/// given an `Isa` may use its level's instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(CpuLevel);

impl Isa {
    /// The portable level, which runs everywhere.
    pub const SCALAR: Isa = Isa(CpuLevel::Scalar);

    /// `level`, if this CPU runs it.
    pub fn new(level: CpuLevel) -> Option<Isa> {
        level.available().then_some(Isa(level))
    }

    pub fn level(self) -> CpuLevel {
        self.0
    }
}

/// The level the kernels use here: the best the CPU has, capped by `KERNELS_CPU_LEVEL`.
/// Detected once.
pub fn cpu_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    // The capped features are a subset of the detected ones, so their level runs here.
    *ISA.get_or_init(|| Isa(cpu_features().best_level()))
}

/// [`cpu_isa`]'s level.
pub fn cpu_level() -> CpuLevel {
    cpu_isa().level()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_FEATURES: CpuFeatures = CpuFeatures {
        avx2: true,
        fma: true,
        f16c: true,
        avx512f: true,
        avx512bw: true,
        avx512vl: true,
        avx512vnni: true,
        avxvnni: true,
    };

    #[test]
    fn names_round_trip() {
        for l in CpuLevel::ALL {
            assert_eq!(CpuLevel::parse(l.name()), Some(l));
            assert_eq!(l.to_string(), l.name());
        }
        assert_eq!(CpuLevel::parse("avx3"), None);
    }

    #[test]
    fn a_cap_keeps_the_levels_up_to_it() {
        let cases = [
            (Some("scalar"), CpuLevel::Scalar),
            (Some("avx2"), CpuLevel::Avx2),
            (Some("AVXVNNI"), CpuLevel::AvxVnni),
            (Some("avx512"), CpuLevel::Avx512),
            (Some(" avx512vnni "), CpuLevel::Avx512Vnni),
            (None, CpuLevel::Avx512Vnni),
            (Some(""), CpuLevel::Avx512Vnni),
        ];
        for (cap, want) in cases {
            assert_eq!(capped(ALL_FEATURES, cap).best_level(), want, "{cap:?}");
        }
        // A cap at AVX-512 keeps AVX-VNNI (a lower level) but not AVX-512 VNNI.
        let f = capped(ALL_FEATURES, Some("avx512"));
        assert!(f.avxvnni && f.avx512f && !f.avx512vnni);
    }

    #[test]
    fn an_unknown_cap_is_ignored() {
        assert_eq!(capped(ALL_FEATURES, Some("avx1024")), ALL_FEATURES);
        let avx2_only = CpuLevel::Avx2.needs();
        assert_eq!(capped(avx2_only, Some("fast")), avx2_only);
    }

    #[test]
    fn a_cap_above_the_cpu_changes_nothing() {
        let avx2_only = CpuLevel::Avx2.needs();
        assert_eq!(capped(avx2_only, Some("avx512vnni")), avx2_only);
        assert_eq!(avx2_only.best_level(), CpuLevel::Avx2);
        // AVX-512 VNNI without AVX-VNNI (as on Zen 4): the best level is AVX-512 VNNI.
        let no_avxvnni = CpuFeatures {
            avxvnni: false,
            ..ALL_FEATURES
        };
        assert_eq!(no_avxvnni.best_level(), CpuLevel::Avx512Vnni);
    }

    #[test]
    fn the_used_level_runs_here() {
        let isa = cpu_isa();
        assert!(isa.level().available(), "{isa:?}");
        assert_eq!(Isa::new(isa.level()), Some(isa));
        assert_eq!(Isa::new(CpuLevel::Scalar), Some(Isa::SCALAR));
        for l in CpuLevel::ALL {
            assert_eq!(Isa::new(l).is_some(), l.available(), "{l}");
        }
    }
}
