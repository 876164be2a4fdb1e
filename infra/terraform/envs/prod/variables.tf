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
  description = "Kubernetes namespace for Ray and MLflow."
  default     = "sieve"
}

variable "image" {
  type        = string
  description = "The training image built from infra/Dockerfile (ECR URI, ideally @sha256 digest)."
  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "image must be pinned by digest (...@sha256:<64 hex>)."
  }
}

variable "gpu_node_groups" {
  type = map(object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    spot           = bool
  }))
  description = "EKS GPU node groups (see the cost table in infra/README.md)."
  default = {
    a10g = { instance_types = ["g5.2xlarge"], min_size = 0, max_size = 4, spot = true }
  }
}

variable "ray_gpu_worker_groups" {
  type = list(object({
    name   = string
    min    = number
    max    = number
    gpus   = number
    cpus   = number
    memory = string
  }))
  description = "Ray worker groups, one per GPU node group."
  default     = [{ name = "a10g", min = 0, max = 4, gpus = 1, cpus = 7, memory = "28Gi" }]
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource."
  default     = {}
}
