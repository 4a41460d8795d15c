//! Azure clouds: the public cloud, the sovereign clouds, and custom endpoints (Azure Stack Hub).
//!
//! A cloud gives the four things a client needs: the Resource Manager endpoint, the Entra ID
//! authority host, the token audience (asked for as the `{audience}/.default` scope), and the
//! storage DNS suffix (`https://{account}.blob.{suffix}`).

pub use crate::access::scope_for;
use std::fmt;

/// The known clouds, plus `Custom` for Azure Stack Hub or any private endpoint set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudName {
    AzureCloud,
    AzureChinaCloud,
    AzureUSGovernment,
    /// Azure Stack Hub (the Azure CPI's `AzureStack`) or other custom endpoints; every endpoint
    /// must then be configured.
    Custom,
}

impl CloudName {
    /// Parse a cloud name as operators write it (the Azure CPI's `environment` values, the Azure
    /// CLI's names, and short aliases), case-insensitively.
    pub fn parse(value: &str) -> Option<CloudName> {
        let v = value.trim().to_ascii_lowercase();
        Some(match v.as_str() {
            "azurecloud" | "azurepubliccloud" | "public" | "azure" => CloudName::AzureCloud,
            "azurechinacloud" | "china" => CloudName::AzureChinaCloud,
            "azureusgovernment" | "azureusgovernmentcloud" | "usgov" | "usgovernment" => {
                CloudName::AzureUSGovernment
            }
            "azurestack" | "azurestackhub" | "custom" => CloudName::Custom,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CloudName::AzureCloud => "AzureCloud",
            CloudName::AzureChinaCloud => "AzureChinaCloud",
            CloudName::AzureUSGovernment => "AzureUSGovernment",
            CloudName::Custom => "AzureStack",
        }
    }

    /// The cloud's well-known endpoints; `None` for a custom cloud (they must be configured).
    pub fn endpoints(self) -> Option<CloudEndpoints> {
        let (arm, login, storage) = match self {
            CloudName::AzureCloud => (
                "https://management.azure.com",
                "https://login.microsoftonline.com",
                "core.windows.net",
            ),
            CloudName::AzureChinaCloud => (
                "https://management.chinacloudapi.cn",
                "https://login.chinacloudapi.cn",
                "core.chinacloudapi.cn",
            ),
            CloudName::AzureUSGovernment => (
                "https://management.usgovcloudapi.net",
                "https://login.microsoftonline.us",
                "core.usgovcloudapi.net",
            ),
            CloudName::Custom => return None,
        };
        Some(CloudEndpoints {
            arm_endpoint: arm.to_string(),
            authority_host: login.to_string(),
            token_audience: arm.to_string(),
            storage_suffix: storage.to_string(),
        })
    }
}

impl fmt::Display for CloudName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The endpoints of one cloud, as strings (validated into URLs by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEndpoints {
    pub arm_endpoint: String,
    pub authority_host: String,
    /// The resource the ARM token is for; the scope asked for is `{audience}/.default`.
    pub token_audience: String,
    pub storage_suffix: String,
}

/// Endpoints of an Azure Stack Hub from the Azure CPI's `azure_stack` section: ARM at
/// `https://{endpoint_prefix}.{domain}`, storage suffix `{domain}`, token audience `resource`,
/// authority by `authentication` (AzureAD, AzureChinaCloudAD, or ADFS at `https://adfs.{domain}`).
pub fn azure_stack_endpoints(
    domain: &str,
    endpoint_prefix: Option<&str>,
    authentication: Option<&str>,
    resource: Option<&str>,
) -> CloudEndpoints {
    let prefix = endpoint_prefix.unwrap_or("management");
    let arm = format!("https://{prefix}.{domain}");
    let authority = match authentication.map(str::to_ascii_lowercase).as_deref() {
        Some("adfs") => format!("https://adfs.{domain}"),
        Some("azurechinaclouddad") | Some("azurechinacloudad") => {
            "https://login.chinacloudapi.cn".to_string()
        }
        _ => "https://login.microsoftonline.com".to_string(),
    };
    CloudEndpoints {
        token_audience: resource.map(str::to_string).unwrap_or_else(|| arm.clone()),
        arm_endpoint: arm,
        authority_host: authority,
        storage_suffix: domain.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_cloud_endpoints() {
        let e = CloudName::AzureCloud.endpoints().unwrap();
        assert_eq!(e.arm_endpoint, "https://management.azure.com");
        assert_eq!(e.authority_host, "https://login.microsoftonline.com");
        assert_eq!(
            scope_for(&e.token_audience),
            "https://management.azure.com/.default"
        );
        assert_eq!(e.storage_suffix, "core.windows.net");
    }

    #[test]
    fn sovereign_cloud_endpoints() {
        let cn = CloudName::parse("AzureChinaCloud")
            .unwrap()
            .endpoints()
            .unwrap();
        assert_eq!(cn.arm_endpoint, "https://management.chinacloudapi.cn");
        assert_eq!(cn.authority_host, "https://login.chinacloudapi.cn");
        assert_eq!(cn.storage_suffix, "core.chinacloudapi.cn");
        let us = CloudName::parse("azureusgovernment")
            .unwrap()
            .endpoints()
            .unwrap();
        assert_eq!(us.arm_endpoint, "https://management.usgovcloudapi.net");
        assert_eq!(us.authority_host, "https://login.microsoftonline.us");
        assert_eq!(
            scope_for(&us.token_audience),
            "https://management.usgovcloudapi.net/.default"
        );
        assert_eq!(us.storage_suffix, "core.usgovcloudapi.net");
    }

    #[test]
    fn custom_cloud_has_no_builtin_endpoints() {
        assert_eq!(CloudName::parse("AzureStack"), Some(CloudName::Custom));
        assert!(CloudName::Custom.endpoints().is_none());
        assert_eq!(CloudName::parse("AzureGermanCloud"), None);
    }

    #[test]
    fn azure_stack_endpoints_follow_the_cpi() {
        let e = azure_stack_endpoints(
            "local.azurestack.external",
            Some("management"),
            Some("ADFS"),
            Some("https://management.adfs.azurestack.local/abc"),
        );
        assert_eq!(
            e.arm_endpoint,
            "https://management.local.azurestack.external"
        );
        assert_eq!(e.authority_host, "https://adfs.local.azurestack.external");
        assert_eq!(e.storage_suffix, "local.azurestack.external");
        assert_eq!(
            scope_for(&e.token_audience),
            "https://management.adfs.azurestack.local/abc/.default"
        );
        let ad = azure_stack_endpoints("d.example", None, Some("AzureAD"), None);
        assert_eq!(ad.authority_host, "https://login.microsoftonline.com");
        assert_eq!(ad.token_audience, "https://management.d.example");
    }

    #[test]
    fn scope_is_not_doubled() {
        assert_eq!(scope_for("https://x/.default"), "https://x/.default");
        assert_eq!(scope_for("https://x/"), "https://x/.default");
    }
}
