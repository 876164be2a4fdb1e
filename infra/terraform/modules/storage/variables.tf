variable "name" {
  type        = string
  description = "Prefix for resource names."
}

variable "bucket_name" {
  type        = string
  description = "Globally unique name of the project bucket."
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name (3-63 lower-case letters, digits, dots, hyphens)."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  description = "Days after which objects under runs/ (trial checkpoints) expire."
  default     = 90
  validation {
    condition     = var.checkpoint_retention_days >= 7
    error_message = "checkpoint_retention_days must be at least 7."
  }
}

variable "force_destroy" {
  type        = bool
  description = "Let terraform destroy delete the bucket with every object version in it (set true and apply only when tearing down)."
  default     = false
}

variable "access_log_bucket" {
  type        = string
  description = "Bucket receiving S3 server access logs (null: logging off)."
  default     = null
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
