variable "name" {
  type        = string
  description = "Name prefix of every resource (and the EKS cluster name)."
  default     = "sieve"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,20}$", var.name))
    error_message = "name must be 3-21 lower-case letters, digits or hyphens, starting with a letter."
  }
}

variable "environment" {
  type        = string
  description = "Environment tag (prod, staging, ...)."
  default     = "prod"
}

variable "region" {
  type        = string
  description = "AWS region."
  default     = "us-east-1"
}

variable "bucket_name" {
  type        = string
  description = "Globally unique name of the project bucket."
}

variable "vpc_cidr" {
  type        = string
  description = "CIDR of the VPC."
  default     = "10.40.0.0/16"
}

variable "az_count" {
  type        = number
  description = "Availability zones to spread subnets and NAT gateways over."
  default     = 2
}

variable "public_api_cidrs" {
  type        = list(string)
  description = "Office/VPN CIDRs allowed to reach the EKS API; empty keeps it private."
  default     = []
}

variable "namespace" {
  type        = string
  description = "Kubernetes namespace for Ray and MLflow (the IRSA roles trust service accounts in it; ../k8s reads it from this root)."
  default     = "sieve"
}

variable "gpu_node_groups" {
  type = map(object({
    instance_types = list(string)
    gpus_per_node  = number
    min_size       = number
    max_size       = number
    spot           = bool
  }))
  description = "EKS GPU node groups, scaled from zero by cluster-autoscaler (see the cost table in infra/README.md)."
  default = {
    a10g = { instance_types = ["g5.2xlarge"], gpus_per_node = 1, min_size = 0, max_size = 4, spot = true }
  }
}

variable "cpu_node_group" {
  type = object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    spot           = bool
  })
  description = "EKS CPU worker node group (parsing actors, trial drivers), scaled from zero."
  default     = { instance_types = ["m6i.4xlarge"], min_size = 0, max_size = 4, spot = false }
}

variable "deletion_protection" {
  type        = bool
  description = "RDS deletion protection; set false and apply before terraform destroy."
  default     = true
}

variable "force_destroy" {
  type        = bool
  description = "Let terraform destroy empty the versioned bucket; set true and apply only when tearing down."
  default     = false
}

variable "db_password_version" {
  type        = number
  description = "Bump to rotate MLflow's database password (then restart the MLflow deployment)."
  default     = 1
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource."
  default     = {}
}
