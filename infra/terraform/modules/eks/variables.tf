variable "name" {
  type        = string
  description = "Cluster name and resource prefix."
}

variable "kubernetes_version" {
  type        = string
  description = "EKS Kubernetes version."
  default     = "1.33"
  validation {
    condition     = can(regex("^1\\.[0-9]+$", var.kubernetes_version))
    error_message = "kubernetes_version must look like 1.33."
  }
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets for the control plane ENIs and every node group."
}

variable "public_api_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to reach the public API endpoint; empty keeps the API private (reach it over VPN / SSM)."
  default     = []
  validation {
    condition     = alltrue([for c in var.public_api_cidrs : c != "0.0.0.0/0" && c != "::/0"])
    error_message = "public_api_cidrs must not contain 0.0.0.0/0 or ::/0."
  }
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key for Kubernetes secrets encryption and bucket access."
}

variable "system_instance_type" {
  type        = string
  description = "Instance type of the CPU system node group (operator, MLflow, Ray head)."
  default     = "m6i.xlarge"
}

variable "gpu_node_groups" {
  type = map(object({
    instance_types = list(string)
    gpus_per_node  = number
    min_size       = number
    max_size       = number
    spot           = bool
  }))
  description = "GPU node groups by name, e.g. { a10g = { instance_types = [\"g5.2xlarge\"], gpus_per_node = 1, min_size = 0, max_size = 4, spot = true } }; gpus_per_node tells cluster-autoscaler what an empty group offers."
  default = {
    a10g = { instance_types = ["g5.2xlarge"], gpus_per_node = 1, min_size = 0, max_size = 4, spot = true }
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : g.min_size >= 0 && g.max_size >= g.min_size && g.max_size <= 64 && g.gpus_per_node >= 1])
    error_message = "Each GPU node group needs 0 <= min_size <= max_size <= 64 and gpus_per_node >= 1."
  }
}

variable "cpu_node_group" {
  type = object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    spot           = bool
  })
  description = "CPU worker node group (Ray Data parsing actors, trial drivers), scaled from zero."
  default     = { instance_types = ["m6i.4xlarge"], min_size = 0, max_size = 4, spot = false }
  validation {
    condition     = var.cpu_node_group.min_size >= 0 && var.cpu_node_group.max_size >= var.cpu_node_group.min_size
    error_message = "cpu_node_group needs 0 <= min_size <= max_size."
  }
}

variable "vpc_cni_version" {
  type        = string
  description = "Pinned VPC CNI add-on version (network-policy support needs v1.14 or later)."
  default     = "v1.19.5-eksbuild.1"
  validation {
    condition     = can(regex("^v1\\.(1[4-9]|[2-9][0-9])\\.[0-9]+-eksbuild\\.[0-9]+$", var.vpc_cni_version))
    error_message = "vpc_cni_version must be v1.14 or later, pinned (vX.Y.Z-eksbuild.N): older versions do not enforce NetworkPolicies."
  }
}

variable "namespace" {
  type        = string
  description = "Kubernetes namespace of the Ray and MLflow workloads."
  default     = "sieve"
}

variable "bucket_arn" {
  type        = string
  description = "ARN of the project bucket."
}

variable "bucket_access" {
  type = map(object({
    read_write = list(string)
    read_only  = list(string)
  }))
  description = "Object key patterns each workload may use, by service account: Ray jobs write runs/ and only read source models and raw corpora; the MLflow server owns mlflow/."
  default = {
    ray                = { read_write = ["runs/*"], read_only = ["models/*", "corpora/*"] }
    mlflow             = { read_write = ["mlflow/*"], read_only = [] }
    cluster-autoscaler = { read_write = [], read_only = [] }
  }
  validation {
    condition     = alltrue([for k in keys(var.bucket_access) : contains(["ray", "mlflow", "cluster-autoscaler"], k)])
    error_message = "bucket_access keys are service accounts: ray, mlflow, cluster-autoscaler."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
