variable "state_bucket" {
  type        = string
  description = "S3 bucket holding the aws root's Terraform state."
}

variable "aws_state_key" {
  type        = string
  description = "State key of the aws root (as given to its terraform init)."
  default     = "sieve/prod/aws.tfstate"
}

variable "state_region" {
  type        = string
  description = "Region of the state bucket."
  default     = "us-east-1"
}

variable "image" {
  type        = string
  description = "The training image built from infra/Dockerfile (ECR URI pinned by @sha256 digest)."
  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "image must be pinned by digest (...@sha256:<64 hex>)."
  }
}

variable "ray_cpu_worker_group" {
  type = object({
    min    = number
    max    = number
    cpus   = number
    memory = string
  })
  description = "Ray CPU worker group; sized to fit the aws root's cpu_node_group instances."
  default     = { min = 0, max = 4, cpus = 14, memory = "56Gi" }
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
  description = "Ray GPU worker groups, one per GPU node group of the aws root (same name)."
  default     = [{ name = "a10g", min = 0, max = 4, gpus = 1, cpus = 7, memory = "28Gi" }]
}
