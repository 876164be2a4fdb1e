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
    min_size       = number
    max_size       = number
    spot           = bool
  }))
  description = "GPU node groups by name, e.g. { a10g = { instance_types = [\"g5.2xlarge\"], min_size = 0, max_size = 4, spot = true } }."
  default = {
    a10g = { instance_types = ["g5.2xlarge"], min_size = 0, max_size = 4, spot = true }
  }
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : g.min_size >= 0 && g.max_size >= g.min_size && g.max_size <= 64])
    error_message = "Each GPU node group needs 0 <= min_size <= max_size <= 64."
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

variable "bucket_prefixes" {
  type        = map(list(string))
  description = "Object key patterns each workload may use, by service account (ray, mlflow)."
  default = {
    ray    = ["corpora/*", "runs/*", "models/*"]
    mlflow = ["mlflow/*"]
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
