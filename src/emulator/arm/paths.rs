//! ARM paths: a request path parsed (case-insensitively, as ARM does) into what it addresses —
//! one resource, a list at subscription, group or parent scope, an operation, the resources of a
//! group, the storage accounts of a subscription, the management locks at a scope — and its route
//! template for the counters.

use axum::http::StatusCode;

use super::eq;
use super::render::ArmError;
use crate::emulator::store::Kind;

/// A resource address parsed from an ARM path.
#[derive(Debug, Clone)]
pub(crate) struct Addr {
    pub kind: Kind,
    /// Canonical-cased id.
    pub id: String,
    pub key: String,
    pub name: String,
    pub rg_name: String,
    pub parent: Option<(Kind, String, String)>, // kind, key, name
    pub rg: String,
    pub sub: String,
    pub sub_name: String,
}

#[derive(Debug, Clone)]
pub(crate) enum Scope {
    Sub(String),
    Rg(String),
    Parent(Kind, String, String),
}

#[derive(Debug, Clone)]
pub(crate) enum Target {
    Item(Addr),
    List {
        kind: Kind,
        scope: Scope,
    },
    Operation {
        id: String,
    },
    /// `GET /subscriptions/{s}/resourceGroups/{rg}/resources` (Microsoft.Resources): every
    /// resource of the group, optionally filtered by one tag; `rg` is the lower-cased group id.
    Resources {
        rg: String,
    },
    /// `GET /subscriptions/{s}/providers/Microsoft.Storage/storageAccounts` (Storage Accounts -
    /// List); `sub` is the lower-cased subscription id.
    StorageAccounts {
        sub: String,
    },
    /// `{scope}/providers/Microsoft.Authorization/locks[/{name}]` (Management Locks, an extension
    /// resource of any scope): one lock (`name`, percent-decoded) or the list at `scope`.
    Lock {
        scope: LockScope,
        name: Option<String>,
    },
}

/// Where a management lock lives: a subscription, a resource group, or a resource the emulator
/// serves.
#[derive(Debug, Clone)]
pub(crate) enum LockScope {
    /// `/subscriptions/{s}`, as the request spelled it.
    Sub(String),
    /// `/subscriptions/{s}/resourceGroups/{rg}` (the segment keyword canonical, names as sent).
    Rg(String),
    Resource(Box<Addr>),
}

impl LockScope {
    /// The scope's id as the request spelled its names.
    pub(crate) fn id(&self) -> &str {
        match self {
            LockScope::Sub(id) | LockScope::Rg(id) => id,
            LockScope::Resource(a) => &a.id,
        }
    }

    /// The scope's lower-cased id: a lock at scope S covers every key S is a prefix of (at a
    /// `/` boundary).
    pub(crate) fn key(&self) -> String {
        self.id().to_lowercase()
    }
}

fn top_kind(seg: &str) -> Option<Kind> {
    [
        ("galleries", Kind::Gallery),
        ("virtualMachines", Kind::VirtualMachine),
        ("virtualMachineScaleSets", Kind::ScaleSet),
        ("disks", Kind::Disk),
        ("images", Kind::ManagedImage),
    ]
    .into_iter()
    .find(|(s, _)| eq(s, seg))
    .map(|(_, k)| k)
}

fn child_of(kind: Kind) -> Option<(&'static str, Kind)> {
    match kind {
        Kind::Gallery => Some(("images", Kind::Image)),
        Kind::Image => Some(("versions", Kind::Version)),
        Kind::ScaleSet => Some(("virtualMachines", Kind::ScaleSetVm)),
        _ => None,
    }
}

fn segment(kind: Kind) -> &'static str {
    match kind {
        Kind::Gallery => "galleries",
        Kind::Image => "images",
        Kind::Version => "versions",
        Kind::VirtualMachine => "virtualMachines",
        Kind::ScaleSet => "virtualMachineScaleSets",
        Kind::ScaleSetVm => "virtualMachines",
        Kind::Disk => "disks",
        Kind::ManagedImage => "images",
        Kind::SoftDeletedVersion => "versions",
    }
}

fn placeholder(kind: Kind) -> &'static str {
    match kind {
        Kind::Gallery => "{gallery}",
        Kind::Image => "{image}",
        Kind::Version => "{version}",
        Kind::VirtualMachine => "{vm}",
        Kind::ScaleSet => "{vmss}",
        Kind::ScaleSetVm => "{instance}",
        Kind::Disk => "{disk}",
        Kind::ManagedImage => "{managedImage}",
        Kind::SoftDeletedVersion => "{version}",
    }
}

fn unknown_path(path: &str) -> ArmError {
    ArmError::new(
        StatusCode::NOT_FOUND,
        "InvalidResourceType",
        &format!("The resource type for path '{path}' could not be found in the namespace 'Microsoft.Compute'."),
    )
}

pub(crate) fn parse_target(path: &str) -> Result<Target, ArmError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(lock) = lock_target(path, &segs) {
        return lock;
    }
    if segs.len() < 4 || !eq(segs[0], "subscriptions") {
        return Err(unknown_path(path));
    }
    let sub_name = segs[1];
    let sub = format!("/subscriptions/{}", sub_name.to_lowercase());
    if segs.len() == 5
        && eq(segs[2], "providers")
        && eq(segs[3], "Microsoft.Storage")
        && eq(segs[4], "storageAccounts")
    {
        return Ok(Target::StorageAccounts { sub });
    }
    if eq(segs[2], "providers") {
        if !eq(segs[3], "Microsoft.Compute") {
            return Err(unknown_path(path));
        }
        return match &segs[4..] {
            [k] => match top_kind(k) {
                Some(kind) => Ok(Target::List {
                    kind,
                    scope: Scope::Sub(sub),
                }),
                None => Err(unknown_path(path)),
            },
            [l, _loc, o, id] if eq(l, "locations") && eq(o, "operations") => {
                Ok(Target::Operation { id: id.to_string() })
            }
            _ => Err(unknown_path(path)),
        };
    }
    if segs.len() == 5 && eq(segs[2], "resourceGroups") && eq(segs[4], "resources") {
        return Ok(Target::Resources {
            rg: format!("{sub}/resourcegroups/{}", segs[3].to_lowercase()),
        });
    }
    if segs.len() < 7
        || !eq(segs[2], "resourceGroups")
        || !eq(segs[4], "providers")
        || !eq(segs[5], "Microsoft.Compute")
    {
        return Err(unknown_path(path));
    }
    let rg_name = segs[3];
    let rg = format!("{sub}/resourcegroups/{}", rg_name.to_lowercase());
    let base =
        format!("/subscriptions/{sub_name}/resourceGroups/{rg_name}/providers/Microsoft.Compute");
    let rest = &segs[6..];
    let top = top_kind(rest[0]).ok_or_else(|| unknown_path(path))?;
    if rest.len() == 1 {
        return Ok(Target::List {
            kind: top,
            scope: Scope::Rg(rg),
        });
    }
    if let Some(list) = soft_deleted_list(&base, top, rest) {
        return Ok(list);
    }
    let mut kind = top;
    let mut name = rest[1].to_string();
    let mut id = format!("{base}/{}/{}", segment(top), name);
    let mut parent = None;
    let mut i = 2;
    loop {
        if i == rest.len() {
            return Ok(Target::Item(Addr {
                kind,
                key: id.to_lowercase(),
                id,
                name,
                rg_name: rg_name.to_string(),
                parent,
                rg,
                sub,
                sub_name: sub_name.to_string(),
            }));
        }
        let (seg, child) = child_of(kind).ok_or_else(|| unknown_path(path))?;
        if !eq(rest[i], seg) {
            return Err(unknown_path(path));
        }
        if i + 1 == rest.len() {
            return Ok(Target::List {
                kind: child,
                scope: Scope::Parent(kind, id.to_lowercase(), name),
            });
        }
        parent = Some((kind, id.to_lowercase(), name.clone()));
        name = rest[i + 1].to_string();
        id = format!("{id}/{seg}/{name}");
        kind = child;
        i += 2;
    }
}

/// `{scope}/providers/Microsoft.Authorization/locks[/{name}]`, `None` when the path names no lock
/// (the last `providers/Microsoft.Authorization/locks` in it: a lock name has no `/`). The scope
/// is a subscription, a resource group or any resource the emulator serves; anything else is an
/// unknown path.
fn lock_target(path: &str, segs: &[&str]) -> Option<Result<Target, ArmError>> {
    let at = segs.windows(3).rposition(|w| {
        eq(w[0], "providers") && eq(w[1], "Microsoft.Authorization") && eq(w[2], "locks")
    })?;
    let name = match &segs[at + 3..] {
        [] => None,
        // Clients may escape a lock name's parentheses.
        [name] => Some(crate::emulator::blob::percent_decode(name)),
        _ => return Some(Err(unknown_path(path))),
    };
    let scope = match &segs[..at] {
        [s, sub] if eq(s, "subscriptions") => LockScope::Sub(format!("/subscriptions/{sub}")),
        [s, sub, g, rg] if eq(s, "subscriptions") && eq(g, "resourceGroups") => {
            LockScope::Rg(format!("/subscriptions/{sub}/resourceGroups/{rg}"))
        }
        scope => match parse_target(&format!("/{}", scope.join("/"))) {
            Ok(Target::Item(a)) => LockScope::Resource(Box::new(a)),
            _ => return Some(Err(unknown_path(path))),
        },
    };
    Some(Ok(Target::Lock { scope, name }))
}

/// `galleries/{g}/softDeletedArtifactTypes/Images/artifacts/{definition}/versions` (the list of a
/// definition's soft-deleted versions, SPEC26): a list at the definition's scope.
fn soft_deleted_list(base: &str, top: Kind, rest: &[&str]) -> Option<Target> {
    match rest {
        [_, g, t, images, artifacts, d, versions]
            if top == Kind::Gallery
                && eq(t, "softDeletedArtifactTypes")
                && eq(images, "Images")
                && eq(artifacts, "artifacts")
                && eq(versions, "versions") =>
        {
            Some(Target::List {
                kind: Kind::SoftDeletedVersion,
                scope: Scope::Parent(
                    Kind::Image,
                    format!("{base}/galleries/{g}/images/{d}").to_lowercase(),
                    d.to_string(),
                ),
            })
        }
        _ => None,
    }
}

/// The route template of an ARM path, for counters (`/subscriptions/{s}/.../versions/{version}`).
pub(crate) fn route_template(path: &str) -> String {
    let base_rg = "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute";
    let chain = |kind: Kind| -> Vec<Kind> {
        let mut v = vec![kind];
        let mut k = kind;
        loop {
            let parent = [Kind::Gallery, Kind::Image, Kind::ScaleSet]
                .into_iter()
                .find(|p| child_of(*p).map(|c| c.1) == Some(k));
            match parent {
                Some(p) => {
                    v.insert(0, p);
                    k = p;
                }
                None => return v,
            }
        }
    };
    let items = |kinds: &[Kind]| -> String {
        kinds
            .iter()
            .map(|k| format!("/{}/{}", segment(*k), placeholder(*k)))
            .collect()
    };
    match parse_target(path) {
        Ok(Target::List {
            kind: Kind::SoftDeletedVersion,
            ..
        }) => format!(
            "{base_rg}/galleries/{{gallery}}/softDeletedArtifactTypes/Images/artifacts/{{image}}/versions"
        ),
        Ok(Target::Item(a)) => format!("{base_rg}{}", items(&chain(a.kind))),
        Ok(Target::List { kind, scope }) => {
            let c = chain(kind);
            let prefix = items(&c[..c.len() - 1]);
            match scope {
                Scope::Sub(_) => format!(
                    "/subscriptions/{{s}}/providers/Microsoft.Compute/{}",
                    segment(kind)
                ),
                _ => format!("{base_rg}{prefix}/{}", segment(kind)),
            }
        }
        Ok(Target::Operation { .. }) => {
            "/subscriptions/{s}/providers/Microsoft.Compute/locations/{location}/operations/{id}"
                .into()
        }
        Ok(Target::Resources { .. }) => "/subscriptions/{s}/resourceGroups/{rg}/resources".into(),
        Ok(Target::StorageAccounts { .. }) => {
            "/subscriptions/{s}/providers/Microsoft.Storage/storageAccounts".into()
        }
        Ok(Target::Lock { scope, name }) => {
            let scope = match scope {
                LockScope::Sub(_) => "/subscriptions/{s}".to_string(),
                LockScope::Rg(_) => "/subscriptions/{s}/resourceGroups/{rg}".to_string(),
                LockScope::Resource(a) => format!("{base_rg}{}", items(&chain(a.kind))),
            };
            let name = if name.is_some() { "/{name}" } else { "" };
            format!("{scope}/providers/Microsoft.Authorization/locks{name}")
        }
        Err(_) => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_case_insensitively_into_ids_and_keys() {
        let t = parse_target("/SUBSCRIPTIONS/s1/resourcegroups/RG/Providers/microsoft.compute/Galleries/g/IMAGES/i/versions/1.0.0").unwrap();
        let Target::Item(a) = t else {
            panic!("item expected")
        };
        assert_eq!(a.kind, Kind::Version);
        assert_eq!(
            a.id,
            "/subscriptions/s1/resourceGroups/RG/providers/Microsoft.Compute/galleries/g/images/i/versions/1.0.0"
        );
        assert_eq!(a.parent.as_ref().map(|p| p.0), Some(Kind::Image));
        assert!(matches!(
            parse_target("/subscriptions/s/providers/Microsoft.Compute/virtualMachines"),
            Ok(Target::List {
                kind: Kind::VirtualMachine,
                scope: Scope::Sub(_)
            })
        ));
        assert!(parse_target(
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/bogus"
        )
        .is_err());
    }

    #[test]
    fn route_templates_name_the_parameters() {
        assert_eq!(
            route_template("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/i/versions"),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}/images/{image}/versions"
        );
        assert_eq!(
            route_template("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/x/virtualMachines/0"),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}"
        );
        assert_eq!(
            route_template("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/softdeletedartifacttypes/images/artifacts/d/versions"),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}/softDeletedArtifactTypes/Images/artifacts/{image}/versions"
        );
    }

    #[test]
    fn a_lock_path_names_its_scope_whatever_the_casing() {
        let v = "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/galleries/G/images/D/versions/1.0.0";
        let Ok(Target::Lock {
            scope: LockScope::Resource(a),
            name: Some(name),
        }) = parse_target(&format!(
            "{v}/PROVIDERS/microsoft.authorization/Locks/keep%28me%29"
        ))
        else {
            panic!("a lock at a version expected")
        };
        assert_eq!(
            (a.kind, a.id.as_str(), name.as_str()),
            (Kind::Version, v, "keep(me)")
        );
        let Ok(Target::Lock {
            scope: LockScope::Rg(id),
            name: None,
        }) = parse_target(
            "/subscriptions/S/resourcegroups/RG/providers/Microsoft.Authorization/locks",
        )
        else {
            panic!("the lock list of a group expected")
        };
        assert_eq!(id, "/subscriptions/S/resourceGroups/RG");
        assert!(matches!(
            parse_target("/subscriptions/S/providers/Microsoft.Authorization/locks/l"),
            Ok(Target::Lock {
                scope: LockScope::Sub(_),
                name: Some(_)
            })
        ));
        // A scope the emulator does not serve, or a name with a slash: unknown paths.
        for bad in [
            "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Network/virtualNetworks/n/providers/Microsoft.Authorization/locks/l",
            "/subscriptions/S/providers/Microsoft.Authorization/locks/a/b",
            "/providers/Microsoft.Authorization/locks/l",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
        assert_eq!(
            route_template(&format!("{v}/providers/Microsoft.Authorization/locks/l")),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}/images/{image}/versions/{version}/providers/Microsoft.Authorization/locks/{name}"
        );
        assert_eq!(
            route_template("/subscriptions/S/providers/Microsoft.Authorization/locks"),
            "/subscriptions/{s}/providers/Microsoft.Authorization/locks"
        );
    }

    #[test]
    fn the_soft_deleted_list_is_a_list_at_its_definition() {
        let t = parse_target("/subscriptions/s/resourceGroups/RG/providers/Microsoft.Compute/galleries/G/softDeletedArtifactTypes/Images/artifacts/D/versions").unwrap();
        let Target::List {
            kind: Kind::SoftDeletedVersion,
            scope: Scope::Parent(Kind::Image, key, name),
        } = t
        else {
            panic!("a soft-deleted list expected")
        };
        assert_eq!(
            key,
            "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/galleries/g/images/d"
        );
        assert_eq!(name, "D");
        assert!(parse_target("/subscriptions/s/resourceGroups/RG/providers/Microsoft.Compute/galleries/G/softDeletedArtifactTypes/Images/artifacts/D").is_err());
    }
}
